"""FedBoosting weights, the P-piece split, the Eq. 4.5 fusion, and FedBoosting with HE in a real loop."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import pytest
import torch
from torch import Tensor

from lightning_fl import FedAvg, FederatedDataModule, FederatedLoop, ImageClassifier, RoundContext
from lightning_fl.defences.secure_aggregation.protocol import KEY_FIELD
from lightning_fl.federation.evaluation import ClientEvaluation
from lightning_fl.messages import ClientUpdate
from lightning_fl.server.fedboosting import (
    FedBoosting,
    accuracy_weights,
    eq_4_2_weights,
    fusion_weights,
    integer_weights,
    reference_weights,
    validation_only_weights,
)
from lightning_fl.transforms import ClientTransform
from tests.conftest import plugin_context
from tests.defences.he_helpers import assert_holds_no_private_key, digits, he_transform, run_loop

T = torch.tensor([1.0, 2.0])
V = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # model i (row) on client j's validation set (column)


def test_reference_weights_match_the_authors_formula_by_hand() -> None:
    # a_i = 1/mean_j V_ij * (1/T_i) / sum_k 1/T_k: a = (1/1.5 * 2/3, 1/3.5 * 1/3) = (4/9, 2/21) -> (14/17, 3/17)
    weights = reference_weights(train_losses=T, cross_val_losses=V)
    assert weights.tolist() == pytest.approx([14 / 17, 3 / 17], abs=1e-6)


def test_eq_4_2_weights_match_the_thesis_formula_by_hand() -> None:
    # p = softmax(softmax(T) * sum_j V_ij): z = (3 / (1 + e), 7e / (1 + e))
    z1, z2 = 3 / (1 + math.e), 7 * math.e / (1 + math.e)
    weights = eq_4_2_weights(train_losses=T, cross_val_losses=V)
    assert weights.tolist() == pytest.approx([1 / (1 + math.exp(z2 - z1)), 1 / (1 + math.exp(z1 - z2))], abs=1e-6)


def test_the_two_weightings_disagree_on_which_model_is_better() -> None:
    # model 0 has lower training and validation loss: the code rewards it, Eq. 4.2 taken literally penalises it
    assert reference_weights(train_losses=T, cross_val_losses=V).argmax() == 0
    assert eq_4_2_weights(train_losses=T, cross_val_losses=V).argmax() == 1


def test_accuracy_weights_match_the_authors_acc_mode_by_hand() -> None:
    # a_i = mean_j A_ij * A_i / sum_k A_k: a = (0.6 * 2/3, 0.9 * 1/3) = (0.4, 0.3) -> (4/7, 3/7)
    weights = accuracy_weights(
        train_scores=torch.tensor([1.0, 0.5]), cross_val_scores=torch.tensor([[0.5, 0.7], [0.9, 0.9]])
    )
    assert weights.tolist() == pytest.approx([4 / 7, 3 / 7], abs=1e-6)


def test_validation_only_weights_drop_the_training_factor() -> None:
    # a_i = 1/mean_j V_ij = (1/1.5, 1/3.5) -> (0.7, 0.3), whatever the training losses
    for train in (T, T.flip(0)):
        assert validation_only_weights(train_losses=train, cross_val_losses=V).tolist() == pytest.approx([0.7, 0.3])


def test_inverse_losses_collapse_where_accuracies_stay_bounded() -> None:
    """Round 14 of seed 0, Dirichlet(0.3) in benchmarks/fedboosting_vs_fedavg.py (docs/reproduction.md).

    Client 2 has the easiest local task: its training loss is 40-100x smaller than the others', so 1/T gives it
    0.93 of the update although its mean cross-validation loss is the worst of the four. On accuracies (the
    authors' acc mode) the same models get 0.22-0.27 each.
    """
    train_loss = torch.tensor([0.04336, 0.06056, 0.001066, 0.1115])
    val_loss = torch.tensor([1.479, 1.537, 1.606, 0.4544])[:, None].expand(4, 4)
    assert reference_weights(train_losses=train_loss, cross_val_losses=val_loss).tolist() == pytest.approx(
        [0.02475, 0.01704, 0.9269, 0.03133], abs=1e-4
    )
    train_acc = torch.tensor([1.0, 1.0, 1.0, 0.9903])
    val_acc = torch.tensor([0.761, 0.7186, 0.8599, 0.8594])[:, None].expand(4, 4)
    assert accuracy_weights(train_scores=train_acc, cross_val_scores=val_acc).tolist() == pytest.approx(
        [0.2385, 0.2252, 0.2695, 0.2667], abs=1e-4
    )


@pytest.mark.parametrize(
    ("weights", "train", "cross_val", "match"),
    [
        (accuracy_weights, torch.tensor([1.0, 1.2]), V / 10, r"accuracies in \[0, 1\]"),
        (accuracy_weights, torch.tensor([0.0, 0.0]), V / 10, "zero accuracy for every client"),
        (validation_only_weights, T, -V, "must be > 0"),
    ],
)
def test_bounded_weightings_reject_bad_scores(weights, train: Tensor, cross_val: Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        if weights is accuracy_weights:
            weights(train_scores=train, cross_val_scores=cross_val)
        else:
            weights(train_losses=train, cross_val_losses=cross_val)


@pytest.mark.parametrize(
    ("train", "cross_val", "match"),
    [
        (torch.tensor([1.0, 0.0]), V, "must be > 0"),
        (torch.tensor([1.0, math.nan]), V, "must be finite"),
        (torch.tensor([1.0, 2.0, 3.0]), V, r"shape \(N,\)"),
    ],
)
def test_reference_weights_reject_bad_losses(train: Tensor, cross_val: Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        reference_weights(train_losses=train, cross_val_losses=cross_val)


@pytest.mark.parametrize(
    ("rounding", "expected"), [("floor", [3, 3, 2]), ("round", [4, 4, 3]), ("largest_remainder", [4, 3, 3])]
)
def test_integer_weights_split_into_pieces(rounding: str, expected: list[int]) -> None:
    # p * P = (3.6, 3.6, 2.8): floor loses 2 pieces (thesis), round gains 1 (code), largest remainder keeps 10
    assert integer_weights(torch.tensor([0.36, 0.36, 0.28]), pieces=10, rounding=rounding) == expected


def test_integer_weights_largest_remainder_always_sums_to_pieces() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        p = torch.rand(7, generator=generator)
        p = p / p.sum()
        assert sum(integer_weights(p, pieces=100, rounding="largest_remainder")) == 100
        assert sum(integer_weights(p, pieces=100, rounding="floor")) <= 100


@pytest.mark.parametrize(
    ("p_hat", "pieces", "expected"),
    [([0.9, 0.9, 0.9], 100, [[90, 5, 5], [5, 90, 5], [5, 5, 90]]), ([0.9, 0.6], 10, [[9, 1], [4, 6]])],
)
def test_fusion_weights_follow_eq_4_5(p_hat: list[float], pieces: int, expected: list[list[int]]) -> None:
    assert fusion_weights(p_hat, pieces=pieces) == expected


def one_hot_updates(n: int, round_idx: int = 0) -> list[ClientUpdate]:
    return [ClientUpdate(k, round_idx, {"w": torch.eye(n)[k]}, 10, 1.0) for k in range(n)]


@pytest.mark.parametrize("p_hat_min", [None, 0.5])
def test_fusion_shares_each_model_as_a_mix_dominated_by_itself(p_hat_min: float | None) -> None:
    booster = FedBoosting(fusion_p_hat=0.9, fusion_p_hat_min=p_hat_min, pieces=100)
    ctx = plugin_context(num_clients=4, clients_per_round=4)
    shared = torch.stack([m["w"] for m in booster._shared_models(one_hot_updates(4), ctx)])  # row i: the mix for i
    assert (shared.diagonal() > shared.masked_fill(torch.eye(4, dtype=torch.bool), 0).max(dim=1).values).all()
    assert (shared.masked_fill(torch.eye(4, dtype=torch.bool), 1) > 0).all()  # every other model is mixed in
    next_round = dataclasses.replace(ctx, round_idx=1)
    later = torch.stack([m["w"] for m in booster._shared_models(one_hot_updates(4, round_idx=1), next_round)])
    assert torch.equal(shared, later) == (p_hat_min is None)  # random p_hat: new fusing weights every round


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weighting": "softmax"}, r"weighting='softmax'\) is unknown"),
        ({"train_loss": "last"}, r"train_loss='last'\) is unknown"),
        ({"rounding": "ceil"}, r"rounding='ceil'\) is unknown"),
        ({"pieces": 0}, r"pieces=0\) must be >= 1"),
        ({"fusion_p_hat": 1.5}, r"fusion_p_hat=1.5\) must be in \(0, 1\]"),
        ({"fusion_p_hat_min": 0.5}, "needs fusion_p_hat set"),
        ({"weighting": "accuracies", "train_loss": "epoch_mean"}, "needs train_loss='after_training'"),
    ],
)
def test_fedboosting_rejects_bad_options(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FedBoosting(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "data", "match"),
    [
        ({"fusion_p_hat": 0.3}, {}, r"p_hat=0.3 must exceed 1/N = 0.333"),
        ({"fusion_p_hat": 0.9, "pieces": 10}, {}, r"floor\(\(1 - 0.9\) \* 10 / 2\) = 0"),
        ({}, {"val_fraction": 0.0}, r"clients \[0, 1, 2\] have none; raise data.val_fraction"),
    ],
)
def test_fedboosting_rejects_impossible_setups_before_training(tmp_path, kwargs: dict, data: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run_loop(tmp_path, dm=digits(**data), aggregator=FedBoosting(**kwargs))


class RecordingFedBoosting(FedBoosting):
    """Keeps the plaintext updates of the round (only meaningful without HE)."""

    def aggregate(self, updates: Sequence[ClientUpdate], *, ctx: RoundContext) -> tuple:
        self.updates, self.before = list(updates), {k: v.clone() for k, v in ctx.global_state.items()}
        return super().aggregate(updates, ctx=ctx)


class TimesFour(ClientTransform):
    """Encodes each update as four times its delta, decodes what the server returns (exact: a power of two)."""

    def __init__(self) -> None:
        self.decoded = 0

    def __call__(self, update: ClientUpdate, *, ctx) -> ClientUpdate:
        return dataclasses.replace(update, delta={k: 4 * v for k, v in update.delta.items()})

    def decode_aggregate(self, aggregate: dict, *, ctx) -> dict:
        self.decoded += 1
        return {k: v / 4 for k, v in aggregate.items()}


def test_fedboosting_decodes_what_it_shares_through_the_client_transforms(tmp_path) -> None:
    """The shared models reach the clients through ``decode_aggregate``, the seam that decodes the aggregate: one
    decode for the aggregate, one per cross-validated model and one per training loss; undecoded, the models
    would be evaluated at four times their update and get other weights."""
    plain = run_loop(tmp_path / "plain", aggregator=FedBoosting())
    encoded = run_loop(tmp_path / "encoded", aggregator=FedBoosting(), client_transforms=[TimesFour()])
    assert encoded.client_transforms[0].decoded == 1 + 3 + 3
    assert encoded.aggregator.last_weights == plain.aggregator.last_weights
    assert max(plain.aggregator.last_weights.values()) - min(plain.aggregator.last_weights.values()) > 1e-3


def test_encrypted_fedboosting_with_fusion_equals_the_thesis_integer_aggregate(tmp_path) -> None:
    plain = run_loop(tmp_path / "plain", aggregator=RecordingFedBoosting(fusion_p_hat=0.9))
    secure = run_loop(tmp_path / "he", aggregator=FedBoosting(fusion_p_hat=0.9), client_transforms=[he_transform()])
    booster, step = secure.aggregator, secure.client_transforms[0].spec.step
    assert list(booster.last_weights.values()) == pytest.approx(list(plain.aggregator.last_weights.values()), abs=1e-4)
    pieces = integer_weights(torch.tensor(list(booster.last_weights.values())), pieces=100, rounding="floor")
    before = {k: v for k, v in plain.aggregator.before.items() if k in plain.aggregator.updates[0].delta}
    for key, start in before.items():
        expected = start + sum(w * u.delta[key] for w, u in zip(pieces, plain.aggregator.updates, strict=True)) / 100
        assert (secure.global_public_state()[key] - expected).abs().max() <= step / 2 + 1e-6, key
    assert {f"fedboosting_weight_{k}" for k in range(3)} <= set(secure.history[0])
    assert_holds_no_private_key(booster, secure.clients[0].extra[KEY_FIELD], skip=(ClientEvaluation,))


def test_fedboosting_is_not_worse_than_fedavg_on_non_iid_digits(tmp_path) -> None:
    """Faster early convergence (thesis Sec. 4.3): after 4 rounds it leads 0.861 to 0.819 on this split.

    After 15 rounds on a 4-client split the default weighting falls behind FedAvg (its weights collapse onto one
    client); ``test_accuracy_weighting_keeps_up_with_fedavg_over_three_seeds`` pins the reading that does not.
    """
    data = {"num_clients": 3, "alpha": 0.3, "image_size": 32, "val_fraction": 0.2}
    options = {"num_rounds": 4, "local_steps": None, "local_epochs": 4, "eval_every": 1, "checkpoint": False}
    fedavg = run_loop(tmp_path / "fedavg", dm=digits(**data), aggregator=FedAvg(), **options)
    boosted = run_loop(tmp_path / "fedboosting", dm=digits(**data), aggregator=FedBoosting(), **options)
    weights = list(boosted.aggregator.last_weights.values())
    assert max(weights) - min(weights) > 0.1  # it does weigh the clients differently from a plain mean
    assert boosted.history[-1]["test_accuracy"] >= fedavg.history[-1]["test_accuracy"]


def test_accuracy_weighting_in_a_loop_weighs_by_the_clients_accuracies(tmp_path) -> None:
    """The loop feeds ``weighting="accuracies"`` the logged ``val_acc``: each recorded training score is a count of
    correct training images over their number, and the recorded weights are the authors' acc-mode formula."""
    dm = digits(val_fraction=0.2)
    options = {"local_steps": None, "local_epochs": 2, "checkpoint": False}
    loop = run_loop(tmp_path, dm=dm, aggregator=FedBoosting(weighting="accuracies"), **options)
    h = loop.history[0]
    train, val, weights = (
        torch.tensor([h[f"fedboosting_{name}_{k}"] for k in range(3)], dtype=torch.float64)
        for name in ("train_score", "val_score", "weight")
    )
    correct = train * torch.tensor([len(dm.client_train_set(k)) for k in range(3)])
    assert (correct - correct.round()).abs().max() < 1e-3 and (correct > 0).all() and ((val > 0) & (val <= 1)).all()
    expected = val * train / train.sum()
    assert weights.tolist() == pytest.approx((expected / expected.sum()).tolist(), abs=1e-6)


@pytest.mark.slow
def test_accuracy_weighting_keeps_up_with_fedavg_over_three_seeds(tmp_path) -> None:
    """Issue 14's bar, configs/fedboosting_digits.yaml setting (4 clients, Dirichlet 0.3, 15 rounds of 3 local
    epochs): FedBoosting with the authors' acc-mode weights is within 1 point of FedAvg over seeds 0-2, where the
    default loss weights end several points below (docs/reproduction.md: 0.910 and 0.843 vs 0.914)."""
    final: dict[str, list[float]] = {"fedavg": [], "accuracies": [], "inverse_losses": []}
    for seed in (0, 1, 2):
        for name, aggregator in (
            ("fedavg", FedAvg()),
            ("accuracies", FedBoosting(weighting="accuracies")),
            ("inverse_losses", FedBoosting()),
        ):
            dm = FederatedDataModule("digits", num_clients=4, alpha=0.3, val_fraction=0.2, image_size=32, seed=seed)
            torch.manual_seed(seed)
            loop = FederatedLoop(
                ImageClassifier("lenet_dlg", lr=2e-3, **dm.model_options), dm, num_rounds=15, clients_per_round=4,
                local_epochs=3, aggregator=aggregator, output_dir=tmp_path / f"{name}{seed}", progress_bar=False,
                checkpoint=False, seed=seed,
            )  # fmt: skip
            final[name].append(loop.fit()["test_accuracy"])
    mean = {name: sum(v) / len(v) for name, v in final.items()}
    assert mean["accuracies"] >= mean["fedavg"] - 0.01, final
    assert mean["inverse_losses"] < mean["fedavg"] - 0.03, final
