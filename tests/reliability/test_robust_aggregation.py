"""One client scaling its update x50 every round wrecks FedAvg; a robust aggregator keeps the model (a tiny run of
benchmarks/faulty_updates.py --robust, whose quickstart table is in docs/algorithms.md)."""

from __future__ import annotations

import pytest

from lightning_fl import FedAvg, NormBounding, TrimmedMean
from tests.conftest import load_benchmark

TINY = {
    "seed": 0,
    "data": {"dataset": "digits", "num_clients": 5, "partition": "iid", "image_size": 16, "batch_size": 32},
    "model": {"class_path": "lightning_fl.models.ImageClassifier", "init_args": {"backbone": "lenet_dlg", "lr": 2e-3}},
    "loop": {"num_rounds": 3, "clients_per_round": 5, "local_steps": 10, "eval_every": 3},
}


@pytest.fixture(scope="module")
def honest() -> float:
    return load_benchmark("faulty_updates").robust_run(TINY, FedAvg(), scale=None)


def test_a_scaled_update_wrecks_fedavg(honest: float) -> None:
    attacked = load_benchmark("faulty_updates").robust_run(TINY, FedAvg(), scale=50.0)
    assert honest > 0.4 and attacked < 0.2


@pytest.mark.parametrize("aggregator", [NormBounding(factor=2.0), TrimmedMean(beta=0.2)], ids=["norm", "trimmed"])
def test_a_robust_aggregator_holds_where_fedavg_fails(honest: float, aggregator) -> None:
    attacked = load_benchmark("faulty_updates").robust_run(TINY, aggregator, scale=50.0)
    assert attacked > honest - 0.1
