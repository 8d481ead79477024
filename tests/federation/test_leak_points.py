"""The type-0 leak point shows what is broadcast: the aggregate after the server transforms (server-side DP noise)."""

from __future__ import annotations

import pytest
import torch

from lightning_fl import FederatedCallback
from lightning_fl.attacks import DLGAttack
from lightning_fl.callbacks import GradientLeakage
from lightning_fl.defences import FedSDPServerNoise
from lightning_fl.private import public_state
from tests.conftest import one_step_attack_loop


class _Type0(FederatedCallback):
    def __init__(self) -> None:
        self.views = []

    def on_aggregate_end(self, loop, view, ground_truth) -> None:
        self.views.append(view)


def test_the_type_0_view_is_the_noised_delta_the_new_global_model_carries(tmp_path) -> None:
    seen = _Type0()
    loop = one_step_attack_loop(tmp_path, callbacks=[seen], defences=[FedSDPServerNoise(noise_multiplier=1.0)])
    loop.fit()
    (view,) = seen.views
    before, after = public_state(view.model), public_state(loop.global_model)
    assert set(view.tensors) == set(loop.spec.update_keys)
    for key, delta in view.tensors.items():
        assert torch.equal(before[key] + delta, after[key])  # exactly the broadcast step, noise included
    assert max(float(d.abs().max()) for d in view.tensors.values()) > 0.5  # noise std 1.0, not a 0.1-lr SGD step


@pytest.mark.parametrize(("noise", "recovered"), [(0.0, True), (1.0, False)])
def test_an_attack_on_the_type_0_view_sees_the_server_noise(tmp_path, noise: float, recovered: bool) -> None:
    attack = GradientLeakage(DLGAttack(max_iterations=300, restarts=4, progress_bar=False), leak_point="aggregate")
    defences = [FedSDPServerNoise(noise_multiplier=noise)] if noise else []
    entry = one_step_attack_loop(tmp_path, callbacks=[attack], defences=defences).fit()["attacks"][0]
    assert entry["leak_point"] == "aggregate"
    assert (entry["psnr"] >= 30) is recovered, entry["psnr"]
