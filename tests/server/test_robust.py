"""Robust aggregation (lightning_fl.server.robust): each rule against its formula and against Flower's function of
the same name on the same updates (rtol 1e-5), and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.server.strategy.aggregate import aggregate_krum, aggregate_median, aggregate_trimmed_avg

from lightning_fl import ClientUpdate, CoordinateMedian, Krum, NormBounding, TrimmedMean
from lightning_fl.contexts import SetupContext
from lightning_fl.defences import PaillierEncryption, SecAggMasking
from lightning_fl.federation.composition import check_robust_reads_plaintext
from lightning_fl.server import bound_norms, coordinate_median, krum_scores, multi_krum, trimmed_mean, update_norms
from tests.conftest import plugin_context

SHAPES = {"conv.weight": (3, 2, 2), "conv.bias": (3,), "fc.weight": (4, 5)}


def _deltas(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    deltas = [{k: torch.randn(s, generator=g) for k, s in SHAPES.items()} for _ in range(n)]
    deltas[-1] = {k: 50 * v for k, v in deltas[-1].items()}  # one scaled update
    return deltas


def _flower(deltas, weights) -> list:
    return [([v.numpy() for v in d.values()], int(w)) for d, w in zip(deltas, weights, strict=True)]


def _assert_matches(ours: dict, theirs: list) -> None:
    for (key, value), expected in zip(ours.items(), theirs, strict=True):
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-5, atol=1e-7, err_msg=key)


@pytest.mark.parametrize("n", [4, 5, 7])
def test_coordinate_median_matches_flower(n: int) -> None:
    deltas = _deltas(n, seed=n)
    _assert_matches(coordinate_median(deltas), aggregate_median(_flower(deltas, [1] * n)))


@pytest.mark.parametrize(("n", "beta"), [(5, 0.2), (7, 0.3), (10, 0.1), (4, 0.0)])
def test_trimmed_mean_matches_flower(n: int, beta: float) -> None:
    deltas = _deltas(n, seed=n)
    _assert_matches(trimmed_mean(deltas, beta=beta), aggregate_trimmed_avg(_flower(deltas, [1] * n), beta))


@pytest.mark.parametrize(("n", "f", "to_keep"), [(5, 1, 1), (7, 2, 1), (7, 1, 3), (10, 2, 5)])
def test_krum_and_multi_krum_match_flower(n: int, f: int, to_keep: int) -> None:
    deltas, weights = _deltas(n, seed=n), [10 + 3 * k for k in range(n)]
    ours, kept = multi_krum(deltas, weights, num_malicious=f, to_keep=to_keep)
    theirs = aggregate_krum(_flower(deltas, weights), num_malicious=f, to_keep=0 if to_keep == 1 else to_keep)
    _assert_matches(ours, theirs)
    assert n - 1 not in kept  # the scaled update is never chosen


def test_krum_scores_sum_the_n_minus_f_minus_2_closest_squared_distances() -> None:
    points = [0.0, 1.0, 3.0, 4.0, 20.0]
    scores = krum_scores([{"w": torch.tensor([p])} for p in points], num_malicious=1)  # n - f - 2 = 2 neighbours
    expected = [sorted((p - q) ** 2 for q in points if q is not p)[:2] for p in points]
    assert scores.tolist() == [sum(e) for e in expected]


def test_coordinate_median_of_an_even_count_is_the_mean_of_the_middle_two() -> None:
    deltas = [{"w": torch.tensor([v, -v])} for v in (1.0, 2.0, 4.0, 100.0)]
    assert coordinate_median(deltas)["w"].tolist() == [3.0, -3.0]


def test_trimmed_mean_is_the_mean_of_the_values_left_after_cutting_each_end() -> None:
    deltas = [{"w": torch.tensor([v])} for v in (-100.0, 1.0, 2.0, 6.0, 100.0)]
    assert trimmed_mean(deltas, beta=0.2)["w"].item() == pytest.approx(3.0)


def test_bound_norms_clips_only_updates_above_factor_times_the_median_norm() -> None:
    deltas = _deltas(5)
    norms = update_norms(deltas)
    bounded, bound = bound_norms(deltas, factor=1.5)
    assert bound == pytest.approx(1.5 * norms.median().item())
    after = update_norms(bounded)
    assert torch.all(after <= bound * (1 + 1e-6))
    untouched = norms <= bound
    assert torch.allclose(after[untouched], norms[untouched])
    direction = torch.nn.functional.cosine_similarity(
        torch.cat([v.flatten() for v in bounded[-1].values()]),
        torch.cat([v.flatten() for v in deltas[-1].values()]),
        dim=0,
    )
    assert direction.item() == pytest.approx(1.0)  # clipping scales, never turns


def test_norm_bounding_keeps_a_scaled_update_from_dominating_the_average() -> None:
    updates = [ClientUpdate(k, 0, d, 10, 0.0) for k, d in enumerate(_deltas(5))]
    aggregate, metrics = NormBounding(factor=2.0).aggregate(updates, ctx=None)
    honest_norm = update_norms([u.delta for u in updates[:-1]]).max().item()
    assert update_norms([aggregate]).item() <= 2 * honest_norm
    assert metrics["clipped_clients"] == 1.0


@pytest.mark.parametrize("aggregator", [NormBounding(), CoordinateMedian(), TrimmedMean(), Krum()])
def test_robust_aggregators_refuse_encrypted_updates(aggregator) -> None:
    updates = [ClientUpdate(k, 0, {}, 1, 0.0, payload=object()) for k in range(5)]
    with pytest.raises(ValueError, match="reads each client's plaintext update but got encrypted ones"):
        aggregator.aggregate(updates, ctx=None)


@pytest.mark.parametrize("transform", [PaillierEncryption(key_size=256, max_weight_sum=4), SecAggMasking()])
def test_a_robust_aggregator_with_encryption_is_a_config_error(transform) -> None:
    with pytest.raises(ValueError, match=rf"loop.aggregator=TrimmedMean compares .* {type(transform).__name__}"):
        check_robust_reads_plaintext(TrimmedMean(), [transform])


def _setup(clients_per_round: int) -> SetupContext:
    spec = plugin_context(num_clients=10, clients_per_round=clients_per_round).spec
    return SetupContext(spec=spec, test_set=None, global_model=None)


@pytest.mark.parametrize(
    ("aggregator", "k", "message"),
    [
        (Krum(num_malicious=1), 4, r"needs loop.clients_per_round > 2 x num_malicious \+ 2 = 4 .* got 4"),
        (Krum(num_malicious=1, to_keep=6), 5, r"and >= to_keep, got 5"),
        (TrimmedMean(beta=0.1), 5, r"cuts no update of loop.clients_per_round=5; raise beta to at least 0.2"),
    ],
)
def test_robust_aggregators_refuse_too_few_clients_a_round(aggregator, k: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        aggregator.setup(_setup(k))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: NormBounding(factor=0.5), r"NormBounding\(factor=0.5\) must be >= 1"),
        (lambda: TrimmedMean(beta=0.5), r"TrimmedMean\(beta=0.5\) must lie in \[0, 0.5\)"),
        (lambda: Krum(num_malicious=-1), r"num_malicious must be >= 0"),
    ],
)
def test_robust_aggregators_reject_bad_settings(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()
