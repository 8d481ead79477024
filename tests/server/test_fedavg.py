from __future__ import annotations

import pytest
import torch

from lightning_fl import ClientUpdate, FedAvg, UniformSelector, weighted_average
from lightning_fl.contexts import FederationSpec, RoundContext


def _update(client_id: int, value: float, n: int) -> ClientUpdate:
    return ClientUpdate(client_id=client_id, round_idx=0, delta={"w": torch.full((2,), value)}, num_samples=n, loss=0.0)


def test_fedavg_weights_clients_by_sample_count() -> None:
    delta = FedAvg().aggregate([_update(0, 1.0, 1), _update(1, 5.0, 3)], ctx=None)[0]
    assert torch.allclose(delta["w"], torch.full((2,), 4.0))


def test_fedavg_unweighted_is_the_plain_mean() -> None:
    delta = FedAvg(weighted=False).aggregate([_update(0, 1.0, 1), _update(1, 5.0, 3)], ctx=None)[0]
    assert torch.allclose(delta["w"], torch.full((2,), 3.0))


def test_fedavg_of_identical_clients_is_each_client() -> None:
    updates = [_update(k, 2.5, n) for k, n in enumerate((3, 7, 11))]
    assert torch.equal(FedAvg().aggregate(updates, ctx=None)[0]["w"], torch.full((2,), 2.5))


def test_weighted_average_rejects_zero_total_weight() -> None:
    with pytest.raises(ValueError, match="weights must sum to > 0"):
        weighted_average([{"w": torch.zeros(1)}], [0.0])


def test_uniform_selector_picks_distinct_clients_reproducibly() -> None:
    spec = FederationSpec(
        num_clients=10,
        clients_per_round=5,
        num_rounds=3,
        local_epochs=1,
        local_steps=None,
        seed=1,
        batch_size=8,
        num_train_samples=(8,) * 10,
    )
    pick = UniformSelector().select(RoundContext(spec, round_idx=0))
    again = UniformSelector().select(RoundContext(spec, round_idx=0))
    assert pick == again and len(set(pick)) == 5
    assert UniformSelector().select(RoundContext(spec, round_idx=1)) != pick  # seeded per round
