"""2DP-FL: budget-calibrated client DP-SGD, per-client/shared/no downlink noise, stop when the budget is spent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_fl import FederatedLoop
from lightning_fl.callbacks import PrivacyBudget
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import DownlinkNoise, DualDP, DualDPFL
from lightning_fl.privacy import PrivacyAccountant
from tests.conftest import make_classifier


def _loop(tmp_path: Path, defences: list, callbacks: list, *, num_rounds: int = 3, **kwargs) -> FederatedLoop:
    dm = FederatedDataModule("digits", num_clients=5, partition="label_buckets", image_size=16, batch_size=32, seed=0)
    torch.manual_seed(0)
    options = {"clients_per_round": 2, "local_epochs": 1, "eval_every": 0, "progress_bar": False} | kwargs
    return FederatedLoop(
        make_classifier(dm, optimizer="sgd", lr=0.05),
        dm,
        num_rounds=num_rounds,
        defences=defences,
        callbacks=callbacks,
        output_dir=tmp_path,
        **options,
    )


def test_sigma_is_calibrated_so_every_client_ends_within_the_budget(tmp_path: Path) -> None:
    dual = DualDP(target_epsilon=5.0, delta=1e-3)
    loop = _loop(tmp_path, [dual], [], num_rounds=4)
    sigma = dual.calibrate(loop.spec)
    worst = 0.0
    for k in range(loop.num_clients):
        accountant = PrivacyAccountant()
        steps = loop.spec.steps_per_round(k) * 4
        accountant.step(noise_multiplier=sigma, sample_rate=loop.spec.sample_rate(k), steps=steps)
        worst = max(worst, accountant.get_epsilon(1e-3))
    assert 4.9 <= worst <= 5.0


@pytest.mark.parametrize(("mode", "distinct"), [("per_client", True), ("shared", False)])
def test_downlink_noise_is_independent_per_client_or_shared(tmp_path: Path, mode: str, distinct: bool) -> None:
    loop = _loop(tmp_path, [], [])
    noise = DownlinkNoise(sensitivity=1.0, noise_multiplier=2.0, mode=mode)
    noise.setup(loop.setup_context())
    state = {k: torch.zeros_like(v) for k, v in loop.global_public_state().items()}
    ctx = loop.round_context()
    a, b = noise(state, ctx=loop.runner.context(ctx, 0)), noise(state, ctx=loop.runner.context(ctx, 1))
    assert (not torch.equal(a["backbone.fc.weight"], b["backbone.fc.weight"])) == distinct
    assert a["backbone.fc.weight"].std() == pytest.approx(2.0 / 2**0.5, rel=0.1)  # sigma S / sqrt(U), U = 2


def test_no_downlink_noise_leaves_the_state_alone(tmp_path: Path) -> None:
    loop = _loop(tmp_path, [], [])
    state = loop.global_public_state()
    assert DownlinkNoise(mode="none")(state, ctx=loop.runner.context(loop.round_context(), 0)) is state


def test_training_stops_when_the_budget_is_spent_never_after(tmp_path: Path) -> None:
    bundle, budget = DualDPFL(target_epsilon=None, noise_multiplier=1.0, sensitivity=0.01), PrivacyBudget(3.0)
    dual = bundle.client
    loop = _loop(tmp_path, [bundle], [budget], num_rounds=20, checkpoint=False)
    summary = loop.fit()
    epsilons = [h["epsilon"] for h in summary["history"]]
    assert len(epsilons) < 20 and max(epsilons) <= 3.0
    assert dual.epsilon_projected(loop.spec) > 3.0  # one more round would have overspent
    assert "privacy budget" in summary["stop_reason"]


def test_dual_dp_needs_exactly_one_of_budget_and_sigma() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        DualDP(target_epsilon=None, noise_multiplier=None)


@pytest.mark.parametrize(("kwargs", "match"), [({"mode": "per_round"}, "per_client"), ({"sensitivity": -1.0}, ">= 0")])
def test_downlink_noise_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DownlinkNoise(**kwargs)


def test_downlink_noise_without_sigma_says_what_to_add(tmp_path: Path) -> None:
    loop = _loop(tmp_path, [], [])
    with pytest.raises(ValueError, match="use the DualDPFL defence"):
        DownlinkNoise().setup(loop.setup_context())


def test_a_resume_with_more_rounds_never_spends_past_the_target(tmp_path: Path) -> None:
    """The case of dual_dp_digits.yaml run for 1 round, then resumed with 3: sigma calibrated for 1 round."""
    first = _loop(tmp_path, [DualDPFL(target_epsilon=5.0)], [], num_rounds=1, local_steps=2)
    assert first.fit()["history"][0]["epsilon"] <= 5.0
    resumed = _loop(tmp_path, [DualDPFL(target_epsilon=5.0)], [], num_rounds=3, local_steps=2)
    with pytest.raises(ValueError, match=r"round 1 would bring the cumulative epsilon \(worst case over clients\)"):
        resumed.fit(resume=True)
    assert resumed.round_idx == 1  # refused before round 1 trained
