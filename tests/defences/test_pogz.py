"""DPFL: PoGZ (Eq. 1), budget split (Eq. 3), per-layer Laplace noise (Eq. 4) and the noisy upload in the loop."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from lightning_fl import FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import PoGZNoise, allocate_budget, pogz_laplace_noise, pogz_scores
from lightning_fl.defences.dp.pogz import ALLOCATIONS, dpfl_noisy_update
from lightning_fl.transforms import ClientTransform
from tests.conftest import load_benchmark, make_classifier

table2 = load_benchmark("pogz_table2_sweep")  # the Table II protocol


def _known_net() -> nn.Sequential:
    """Layer 0 passes inputs through (identity), layer 2 sums its two inputs and subtracts 1."""
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    with torch.no_grad():
        net[0].weight.copy_(torch.eye(2))
        net[0].bias.zero_()
        net[2].weight.fill_(1.0)
        net[2].bias.fill_(-1.0)
    return net


def test_pogz_counts_positive_pre_activations_per_layer() -> None:
    net = _known_net().train()
    inputs = torch.tensor([[1.0, -1.0], [2.0, 3.0], [-1.0, -2.0]])  # layer 0: 3 of 6 positive
    scores = pogz_scores(net, [(inputs[:2], None), (inputs[2:], None)])  # batches like a loader's
    # layer 2 sees relu outputs: (1,0)->0, (2,3)->4, (0,0)->-1: 1 of 3 positive
    assert scores == {"0": pytest.approx(3 / 6), "2": pytest.approx(1 / 3)}
    assert net.training and not any(m._forward_hooks for m in net.modules())


def test_pogz_on_empty_data_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="val_fraction"):
        pogz_scores(_known_net(), [])


def test_allocate_budget_is_proportional_and_sums_to_epsilon() -> None:
    budgets = allocate_budget(weights=[0.6, 0.3, 0.1], epsilon=5.0)
    assert budgets == pytest.approx([3.0, 1.5, 0.5]) and sum(budgets) == pytest.approx(5.0)
    assert allocate_budget(weights=ALLOCATIONS["even"]([0.6, 0.3, 0.1]), epsilon=3.0) == [1.0, 1.0, 1.0]


def test_allocate_budget_rejects_a_layer_without_positives() -> None:
    with pytest.raises(ValueError, match="infinite noise"):
        allocate_budget(weights=[0.5, 0.0], epsilon=1.0)


def test_laplace_noise_per_layer_has_scale_sensitivity_over_layer_budget() -> None:
    delta = {"a.weight": torch.zeros(100_000), "a.bias": torch.zeros(10), "b.weight": torch.zeros(100_000)}
    noisy = pogz_laplace_noise(
        delta, layer_epsilons={"a": 0.5, "b": 2.0}, sensitivity=1.0, generator=torch.Generator().manual_seed(0)
    )
    assert noisy["a.weight"].abs().mean() == pytest.approx(2.0, rel=0.03)  # b = 1 / 0.5
    assert noisy["b.weight"].abs().mean() == pytest.approx(0.5, rel=0.03)  # b = 1 / 2


def test_per_layer_clipping_bounds_each_layer_by_its_share_of_alpha_and_scales_its_noise() -> None:
    """alpha 4 split by parameter count (1 : 3); layer a (L1 3.0 > 1.0) is clipped, b (L1 0.3 < 3.0) is not."""
    delta = {"a.weight": torch.full((1,), 3.0), "b.weight": torch.full((3,), 0.1)}
    scores = {"a": 0.5, "b": 0.5}
    common = {"scores": scores, "epsilon": 2.0, "clip_bound": 4.0, "allocation": "even"}
    clipped = dpfl_noisy_update(delta, sensitivity=0.0, clipping="per_layer", **common)
    assert clipped["a.weight"].tolist() == [1.0] and clipped["b.weight"] == pytest.approx(torch.full((3,), 0.1))
    whole = dpfl_noisy_update(delta, sensitivity=0.0, **common)  # Eq. 2: L1 3.3 < 4, nothing clipped
    assert whole["a.weight"].tolist() == [3.0]
    big = {"a.weight": torch.zeros(50_000), "b.weight": torch.zeros(150_000)}
    noisy = dpfl_noisy_update(
        big, sensitivity=1.0, clipping="per_layer", generator=torch.Generator().manual_seed(0), **common
    )
    assert noisy["a.weight"].abs().mean() == pytest.approx(0.25, rel=0.03)  # Delta f * 1/4 over epsilon_a = 1
    assert noisy["b.weight"].abs().mean() == pytest.approx(0.75, rel=0.03)  # Delta f * 3/4 over epsilon_b = 1
    with pytest.raises(ValueError, match="clipping"):
        PoGZNoise(clipping="layerwise")


def _dpfl_loop(tmp_path: Path, *transforms: ClientTransform, **kwargs) -> FederatedLoop:
    dm = FederatedDataModule("digits", num_clients=4, partition="iid", image_size=16, val_fraction=0.2, seed=0)
    torch.manual_seed(0)
    options = {"num_rounds": 2, "clients_per_round": 2, "local_steps": 2, "eval_every": 0, "progress_bar": False}
    return FederatedLoop(
        make_classifier(dm), dm, client_transforms=list(transforms), output_dir=tmp_path, **options | kwargs
    )


def test_noisy_upload_keeps_pogz_on_the_client_and_composes_epsilon_over_rounds(tmp_path: Path) -> None:
    loop = _dpfl_loop(tmp_path, PoGZNoise(epsilon=0.5, clip_bound=5.0), num_rounds=3)
    summary = loop.fit()
    participations = {}
    for h in summary["history"]:
        for k in h["clients"]:
            participations[k] = participations.get(k, 0) + 1
        assert h["epsilon"] == pytest.approx(0.5 * max(participations.values()))
        assert h["epsilon_round"] == 0.5
    trained = loop.clients[summary["history"][0]["clients"][0]]
    assert set(trained.extra[PoGZNoise.extra_pogz]) == {
        "backbone.body.0",
        "backbone.body.2",
        "backbone.body.4",
        "backbone.fc",
    }
    server = torch.load(loop.checkpoint.server_path, weights_only=True)
    assert "dpfl" not in str(server)


class _Seen(ClientTransform):
    """A client transform placed after PoGZNoise: records what the server would receive."""

    def __init__(self) -> None:
        self.deltas: list[dict[str, torch.Tensor]] = []

    def __call__(self, update, *, ctx):
        self.deltas.append(update.delta)
        return update


@pytest.mark.parametrize(
    ("mode", "expected_scale"), [("two_eta_alpha", 2 * 2e-3 * 0.01 / 0.25), ("two_alpha", 2 * 0.01 / 0.25)]
)
def test_sensitivity_forms_set_the_noise_scale(tmp_path: Path, mode: str, expected_scale: float) -> None:
    """epsilon 1 split evenly over 4 layers; a delta clipped to L1 norm 0.01 is negligible beside the noise."""
    seen = _Seen()
    transform = PoGZNoise(epsilon=1.0, clip_bound=0.01, allocation="even", sensitivity=mode)
    _dpfl_loop(tmp_path, transform, seen, num_rounds=1, checkpoint=False).fit()
    noise = torch.cat([v.flatten() for v in seen.deltas[0].values()])
    assert noise.abs().mean() == pytest.approx(expected_scale, rel=0.05)


@pytest.mark.xfail(
    strict=True,
    reason="DPFL Table II direction (PoGZ 'w' > even 'wo' at equal epsilon) does not reproduce on digits: in every "
    "reading measured (paper's 2-conv sigmoid net, DLG LeNet, ReLU variant; noise once or per step; any alpha or "
    "sensitivity, which only move epsilon; whole-update or per-layer clipping; 3 seeds) even allocation is ahead "
    "wherever accuracy is between chance and baseline, because PoGZ gives the logit layer (PoGZ ~0.1) the least "
    "budget (docs/reproduction.md).",
)
def test_pogz_allocation_beats_even_allocation_at_equal_epsilon() -> None:
    """Table II protocol (spec A.2.8) with the paper's MNIST network, at the epsilons where accuracy is informative."""
    cell = table2.table2_cell(
        net="paper2",
        placement="once",
        allocations=["pogz", "even"],
        epsilons=[50.0, 100.0],
        seed=0,
        draws=3,
        image_size=16,
    )
    assert all(w >= wo for w, wo in zip(cell["pogz"], cell["even"], strict=True))
