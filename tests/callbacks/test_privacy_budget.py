"""PrivacyBudget stops the loop before epsilon would exceed the target, says why, and rejects impossible budgets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_fl import FederatedLoop
from lightning_fl.callbacks import PrivacyBudget
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import FedSDP
from lightning_fl.privacy import PrivacyAccountant
from tests.conftest import make_classifier


def _loop(
    tmp_path: Path, budget: PrivacyBudget | None, *, num_rounds: int = 8, transforms: tuple = ()
) -> FederatedLoop:
    dm = FederatedDataModule("digits", num_clients=4, partition="iid", image_size=16, seed=0)
    torch.manual_seed(0)
    return FederatedLoop(
        make_classifier(dm),
        dm,
        num_rounds=num_rounds,
        clients_per_round=2,
        local_steps=1,
        eval_every=0,
        client_transforms=list(transforms),
        callbacks=[budget] if budget else [],
        output_dir=tmp_path,
        checkpoint=False,
        progress_bar=False,
    )


def _epsilon_after(rounds: int) -> float:
    accountant = PrivacyAccountant()
    accountant.step(noise_multiplier=1.0, sample_rate=0.5, steps=rounds)
    return accountant.get_epsilon(1e-5)


@pytest.mark.parametrize("rounds_affordable", [1, 3, 5])
def test_budget_stops_after_the_last_affordable_round(tmp_path: Path, rounds_affordable: int) -> None:
    target = (_epsilon_after(rounds_affordable) + _epsilon_after(rounds_affordable + 1)) / 2
    summary = _loop(tmp_path, PrivacyBudget(target), transforms=(FedSDP(noise_multiplier=1.0),)).fit()
    assert summary["rounds_completed"] == rounds_affordable
    assert summary["history"][-1]["epsilon"] == pytest.approx(_epsilon_after(rounds_affordable))
    assert summary["history"][-1]["epsilon"] <= target
    assert "privacy budget reached" in summary["stop_reason"]


def test_budget_that_fits_all_rounds_does_not_stop(tmp_path: Path) -> None:
    summary = _loop(tmp_path, PrivacyBudget(1e6), num_rounds=2, transforms=(FedSDP(noise_multiplier=1.0),)).fit()
    assert summary["rounds_completed"] == 2 and summary["stop_reason"] is None


def test_budget_smaller_than_one_round_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="round 0 would bring the cumulative epsilon from 0 to "):
        _loop(tmp_path, PrivacyBudget(0.01), transforms=(FedSDP(noise_multiplier=1.0),)).fit()


def test_budget_without_a_dp_defence_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no privacy ledger"):
        _loop(tmp_path, PrivacyBudget(1.0)).fit()


def test_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be a finite number > 0"):
        PrivacyBudget(0.0)
