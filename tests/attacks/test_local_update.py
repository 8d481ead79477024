"""The functional local-update simulation equals a real client's SGD steps (plain autograd)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightning_fl.attacks.local_update import simulated_pseudo_gradient
from tests.attacks.views import digits_view


def test_simulated_pseudo_gradient_equals_real_multistep_sgd_update() -> None:
    view, truth = digits_view(batch_size=2, local_steps=3)
    params = {n: p.detach() for n, p in view.model.named_parameters()}
    buffers = dict(view.model.named_buffers())
    simulated, _ = simulated_pseudo_gradient(
        view.model,
        params,
        buffers,
        truth.inputs,
        F.one_hot(truth.targets, 10).float(),
        local_steps=3,
        lr=0.1,
        data_per_step=2,
    )
    for name, delta in view.tensors.items():
        assert torch.allclose(simulated[name], -delta / 0.1, atol=1e-4), name
