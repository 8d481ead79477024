"""Fed-SDP: per-layer clipping and client-level Gaussian noise on each update; client-level accounting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_fl import FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import FedSDP, FedSDPServerNoise
from lightning_fl.messages import ClientUpdate
from lightning_fl.server import FedAvg
from tests.conftest import make_classifier, plugin_context


def test_fed_sdp_noise_has_std_sigma_c_per_coordinate_around_the_clipped_update() -> None:
    update = ClientUpdate(0, 0, {"w": torch.full((200_000,), 1.0), "b": torch.tensor([0.1])}, num_samples=5, loss=0.0)
    sent = FedSDP(noise_multiplier=0.5, max_grad_norm=2.0)(update, ctx=plugin_context(num_clients=20))
    clipped_w = 2.0 / 200_000**0.5  # the 'w' tensor is clipped to norm C on its own
    assert (sent.delta["w"] - clipped_w).std() == pytest.approx(0.5 * 2.0, rel=0.01)
    assert sent.metadata["clip_bound"] == 2.0


def test_server_variant_adds_one_draw_divided_by_clients_per_round() -> None:
    noisy = FedSDPServerNoise(noise_multiplier=0.5, max_grad_norm=2.0)(
        {"w": torch.zeros(200_000)}, ctx=plugin_context(num_clients=20)
    )
    assert noisy["w"].std() == pytest.approx(0.5 * 2.0 / 2, rel=0.01)


def test_loop_logs_client_level_epsilon_reproducing_table_vi_cancer(tmp_path: Path) -> None:
    """Table VI, Fed-SDP cancer: sigma 6, q2 = K_t/K = 0.1, T = 3 rounds (+1 step, the authors' count)."""
    dm = FederatedDataModule("digits", num_clients=10, partition="iid", image_size=16, seed=0)
    torch.manual_seed(0)
    sdp = FedSDP(noise_multiplier=6.0, max_grad_norm=4.0, conversion="classic", steps_offset=1)
    loop = FederatedLoop(
        make_classifier(dm),
        dm,
        num_rounds=3,
        clients_per_round=1,
        local_steps=1,
        eval_every=0,
        aggregator=FedAvg(weighted=False),
        client_transforms=[sdp],
        output_dir=tmp_path,
        progress_bar=False,
    )
    history = loop.fit()["history"]
    assert history[-1]["epsilon"] == pytest.approx(0.2065, abs=2e-4)
    assert history[0]["epsilon"] < history[1]["epsilon"] < history[2]["epsilon"]
    resumed = FedSDP(noise_multiplier=6.0, max_grad_norm=4.0, conversion="classic", steps_offset=1)
    resumed.load_state_dict(sdp.state_dict())
    assert resumed.epsilon_spent() == pytest.approx(sdp.epsilon_spent())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_grad_norm": -1.0}, "clip bound"), ({"noise_multiplier": -1.0}, ">= 0"), ({"delta": 1.0}, "delta")],
)
def test_fed_sdp_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FedSDP(**kwargs)
