"""DP-FedAvg with adaptive clipping (McMahan et al. 2018; Andrew et al. 2021): clip, noise, clip update, accounting."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from lightning_fl import ClientUpdate
from lightning_fl.cli import main
from lightning_fl.contexts import FederationSpec, RoundContext
from lightning_fl.defences import DPFedAvg
from lightning_fl.defences.dp.dp_fedavg import update_noise_multiplier
from lightning_fl.privacy import PrivacyAccountant, gaussian_noise
from tests.conftest import plugin_context

SPEC = FederationSpec(
    num_clients=50,
    clients_per_round=10,
    num_rounds=40,
    local_epochs=1,
    local_steps=None,
    seed=0,
    batch_size=8,
    num_train_samples=(10,) * 50,
)


def _round(dp: DPFedAvg, round_idx: int, norms: list[float]) -> tuple[dict, dict]:
    """One round: each client's update of the given L2 norm goes through the client half, then the server half."""
    generator = torch.Generator().manual_seed(round_idx)
    updates = []
    for k, norm in enumerate(norms):
        direction = torch.randn(6, generator=generator)
        update = ClientUpdate(k, round_idx, {"w": norm * direction / direction.norm()}, 10, 0.0)
        updates.append(dp(update, ctx=plugin_context(client_id=k)))
    return dp.server_step(updates, RoundContext(SPEC, round_idx))


def test_update_noise_multiplier_composes_to_the_total() -> None:
    z_update = update_noise_multiplier(noise_multiplier=1.0, clipped_count_stddev=0.5 * 10 / 2)
    assert z_update**-2 + (2 * 2.5) ** -2 == pytest.approx(1.0)
    with pytest.raises(ValueError, match="must exceed noise_multiplier/2") as refused:
        update_noise_multiplier(noise_multiplier=1.0, clipped_count_stddev=0.2)  # 4 clients a round, by default
    assert "set clipped_count_stddev=1 (the update's noise multiplier is then 1.15)" in str(refused.value)
    assert "or noise_multiplier below 0.4" in str(refused.value)
    z_update = update_noise_multiplier(noise_multiplier=1.0, clipped_count_stddev=1.0)  # the value it names works
    assert z_update == pytest.approx(2 / 3**0.5)


def test_clients_clip_to_the_bound_and_report_it() -> None:
    dp = DPFedAvg(initial_clip=0.5)
    big = dp(ClientUpdate(0, 0, {"w": torch.tensor([3.0, 4.0])}, 1, 0.0), ctx=plugin_context())
    small = dp(ClientUpdate(1, 0, {"w": torch.tensor([0.3, 0.0])}, 1, 0.0), ctx=plugin_context())
    torch.testing.assert_close(big.delta["w"], torch.tensor([0.3, 0.4]))
    assert big.metadata["dp_fedavg_unclipped"] is False and small.metadata["dp_fedavg_unclipped"] is True


def test_server_step_is_the_noised_average_with_a_fixed_denominator() -> None:
    dp = DPFedAvg(noise_multiplier=0.8, initial_clip=1.0, clip_learning_rate=0.0)
    average, metrics = _round(dp, 0, [5.0, 5.0, 0.5, 2.0])  # 4 of m = 10 clients reported
    generator = torch.Generator().manual_seed(0)
    clipped = []
    for norm in (5.0, 5.0, 0.5, 2.0):
        direction = torch.randn(6, generator=generator)
        clipped.append(min(norm, 1.0) * direction / direction.norm())
    noise = gaussian_noise(torch.zeros(6), std=0.8 * 1.0, generator=RoundContext(SPEC, 0).rng("dp-fedavg"))
    torch.testing.assert_close(average["w"], (sum(clipped) + noise) / 10)
    assert metrics["unclipped_fraction"] == 0.25 and metrics["clip_bound"] == 1.0 and dp.clip == 1.0


def test_clip_moves_geometrically_toward_the_target_quantile() -> None:
    dp = DPFedAvg(noise_multiplier=0.1, initial_clip=0.1, target_quantile=0.5, clip_learning_rate=0.2)
    norms = [0.5 + 0.1 * k for k in range(10)]  # median 0.95
    _round(dp, 0, norms)
    assert dp.clip == pytest.approx(0.1 * math.exp(0.2 * 0.5), rel=0.05)  # every update clipped: C grows e^{0.1}
    for round_idx in range(1, 40):
        _round(dp, round_idx, norms)
    assert 0.7 < dp.clip < 1.25


def test_epsilon_counts_one_step_per_round_at_the_client_sampling_rate() -> None:
    dp = DPFedAvg(noise_multiplier=1.0, clipped_count_stddev=2.0)  # m/20 = 0.5 would be below z/2
    metrics = [_round(dp, r, [1.0] * 10)[1] for r in range(3)]
    expected = PrivacyAccountant()
    expected.step(noise_multiplier=1.0, sample_rate=10 / 50, steps=3)
    assert metrics[-1]["epsilon"] == pytest.approx(expected.get_epsilon(1e-5))
    assert metrics[0]["epsilon"] < metrics[1]["epsilon"] < metrics[2]["epsilon"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier=0.0"),
        ({"initial_clip": -1.0}, "initial_clip=-1.0"),
        ({"target_quantile": 1.0}, "target_quantile=1.0"),
        ({"clip_learning_rate": -0.1}, "clip_learning_rate=-0.1"),
    ],
)
def test_dp_fedavg_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DPFedAvg(**kwargs)


def test_config_runs_through_the_cli_with_epsilon_every_round(tmp_path: Path) -> None:
    config = Path(__file__).parents[2] / "configs" / "dp_fedavg_adaptive_digits.yaml"
    args = ["fit", "--config", str(config), "--output_dir", str(tmp_path), "--loop.num_rounds", "2"]
    assert main([*args, "--loop.progress_bar", "false", "--loop.eval_every", "2"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    epsilons = [h["epsilon"] for h in summary["history"]]
    assert 0 < epsilons[0] < epsilons[1] and summary["privacy"]["DPFedAvg"]["accountant_sample_rate"] == 0.2
    assert summary["history"][1]["clip_bound"] != summary["history"][0]["clip_bound"]
