r"""Per-example DP-SGD on the vectorised clients: each client clipped and noised as its ``PerExampleDP`` does.

A client whose only Trainer callback is a seeded :class:`~lightning_fl.defences.PerExampleDP` (the per-client DP-SGD
of :class:`~lightning_fl.defences.ClientDPSGD` and Fed-CDP's :class:`~lightning_fl.defences.FedCDP`) trains on the
stacked pass too. Its batches are the Poisson batches its own fit draws (same sampler, same seed; possibly empty), and
each step replays Opacus' ``DPOptimizer`` (flat clipping) or ``DPPerLayerOptimizer`` (per-layer clipping) on that
client's examples (Abadi et al., CCS 2016, Alg. 1; Wei et al., ICDCS 2021, Alg. 2 lines 8-15):

.. math::

    \bar g_j = g_j / \max(1, \|g_j\|_2 / C), \qquad
    \tilde g = \frac1B\Big(\sum_{j \in \text{batch}} \bar g_j + \mathcal N(0, s^2 I)\Big),

per parameter tensor for ``clipping="per_layer"``, over the whole gradient for ``"flat"``, with the noise std
:math:`s` of :meth:`PerExampleDP.fit_plan <lightning_fl.defences.PerExampleDP.fit_plan>` (:math:`\sigma C`,
:math:`\sigma C\sqrt M` per layer, times :math:`\sqrt B` for ``noise_scaling="per_example"``) drawn from the
client's own seeded generator, one draw per parameter tensor in the optimiser's order, as Opacus draws them; so for
the same seed the noise is the sequential fit's, not only its distribution. The per-example gradients
:math:`g_j` come from the stacked layers' inputs and output gradients (:meth:`StackedLayer.per_example_gradients
<lightning_fl.federation.vectorised_layers.StackedLayer.per_example_gradients>`), as Opacus' hooks compute them. Each
client's accountant records the same steps as its Trainer fit would (one per optimiser step, empty batches included).

What the vectorised fit leaves to the Trainer path (:func:`dp_callbacks_refusal`, :func:`dp_model_refusal`): other
client callbacks; ``PerExampleDP(seed=None)`` (its noise and batches come from the global generator, interleaved
with the Trainer's own draws); a callback tapping the DP-noised local gradient (the type-2 leak point, released step
by step by the DP optimiser); layers that change their input in place or pad by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

if TYPE_CHECKING:
    from lightning_fl.defences.dp.dp_sgd import DPSGDPlan, PerExampleDP
    from lightning_fl.defences.dp.opacus_hooks import Clipping
    from lightning_fl.federation.vectorised_layers import StackedLayer
    from lightning_fl.privacy.accounting import PrivacyAccountant

__all__ = ["DPClient", "DPClientFit", "StackedDPSGD", "dp_callbacks_refusal", "dp_model_refusal", "per_example_dp"]


def per_example_dp(callbacks: Sequence[L.Callback]) -> PerExampleDP | None:
    """The ``PerExampleDP`` among a client's Trainer ``callbacks`` (exact type), else ``None``."""
    from lightning_fl.defences.dp.dp_sgd import PerExampleDP

    return next((cb for cb in callbacks if type(cb) is PerExampleDP), None)


def dp_callbacks_refusal(callbacks: Sequence[L.Callback]) -> str | None:
    """Why the vectorised fit cannot train a client with these Trainer ``callbacks`` (one line), else ``None``:
    only no callback or one seeded ``PerExampleDP`` whose noised gradient no callback taps qualifies.

    Example:
        >>> from lightning_fl.defences import PerExampleDP
        >>> dp_callbacks_refusal([PerExampleDP(seed=0)]) is None
        True
        >>> dp_callbacks_refusal([PerExampleDP()])[:36]
        'PerExampleDP(seed=None) draws its no'
    """
    dp = per_example_dp(callbacks)
    if dp is None or len(callbacks) > 1:
        return f"client callbacks {sorted({type(cb).__name__ for cb in callbacks})}" if callbacks else None
    if dp.seed is None:
        return (
            "PerExampleDP(seed=None) draws its noise and Poisson batches from the global generator between the "
            "Trainer's own draws; give it a seed (ClientDPSGD and FedCDP seed it per client and round)"
        )
    if dp.release is not None:
        return "a callback taps the DP-noised local gradient (type 2), which the Trainer's DP optimiser releases"
    return None


def dp_model_refusal(model: nn.Module) -> str | None:
    """Why per-example DP cannot run on ``model``'s stacked pass (one line), else ``None``.

    Example:
        >>> dp_model_refusal(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(inplace=True)))
        '1 (ReLU) works in place: per-example DP reads each stacked layer output'
    """
    for path, module in model.named_modules():
        if getattr(module, "inplace", False):
            return f"{path} ({type(module).__name__}) works in place: per-example DP reads each stacked layer output"
        if isinstance(module, nn.Conv2d) and isinstance(module.padding, str):
            return f"{path} pads {module.padding!r}: per-example convolution gradients need numeric padding"
    return None


@dataclass(frozen=True)
class DPClientFit:
    """The settings a ``PerExampleDP`` holds for one client's fit, which its owner (``ClientDPSGD``) sets when that
    client's fit starts: taken then (:meth:`of`) and put back (:meth:`restore`) for its training and fit end."""

    max_grad_norm: float
    seed: int | None
    sample_rate: float | None
    accountant: PrivacyAccountant

    @classmethod
    def of(cls, dp: PerExampleDP) -> DPClientFit:
        return cls(dp.max_grad_norm, dp.seed, dp.sample_rate, dp.privacy_accountant)

    def restore(self, dp: PerExampleDP) -> None:
        dp.max_grad_norm, dp.seed, dp.sample_rate = self.max_grad_norm, self.seed, self.sample_rate
        dp.privacy_accountant = self.accountant


@dataclass
class DPClient:
    """One client's DP-SGD in a vectorised round: its plan, clip bound, noise generator and accountant."""

    plan: DPSGDPlan
    max_grad_norm: float
    generator: torch.Generator | None
    accountant: PrivacyAccountant

    @classmethod
    def start(
        cls, dp: PerExampleDP, fit: DPClientFit, loader: DataLoader, *, num_tensors: int, device: torch.device
    ) -> tuple[DPClient, DataLoader]:
        """The client of ``fit`` and the loader its fit trains on (``loader``'s Poisson form for
        ``sampling="poisson"``), as ``PerExampleDP`` sets them up at the start of a Trainer fit."""
        fit.restore(dp)
        loader, batch_size, sample_rate = dp.fit_loader(loader)
        plan = dp.fit_plan(batch_size=batch_size, sample_rate=sample_rate, num_tensors=num_tensors)
        return cls(plan, dp.max_grad_norm, dp.noise_generator(device), dp.privacy_accountant), loader

    def account(self, steps: int) -> None:
        """Record ``steps`` optimiser steps, as the DP optimiser's step hook does at each."""
        if steps:
            self.accountant.step(
                noise_multiplier=self.plan.accounting_multiplier, sample_rate=self.plan.sample_rate, steps=steps
            )


@dataclass
class StackedDPSGD:
    """Per-example clipping and Gaussian noise of a stacked step, each client as Opacus' DP optimiser does it.

    Args:
        clients: one per client, in the order of :func:`~.vectorised_fit.fit_stacked`'s ``starts``.
        names: the trained parameters in the optimiser's order (the order of the noise draws).
        clipping: ``PerExampleDP``'s: ``flat`` clips each example's whole gradient, ``per_layer`` each of its
            parameter tensors.
    """

    clients: Sequence[DPClient]
    names: Sequence[str]
    clipping: Clipping

    def gradients(
        self, rows: Sequence[int], losses: Tensor, owner: Tensor, layers: Mapping[str, StackedLayer]
    ) -> dict[str, Tensor]:
        """The noised mean of clipped per-example gradients of clients ``rows`` (one row each): ``losses`` are the
        step's per-example losses, ``owner`` the row of each, ``layers`` the stacked layers that recorded the pass."""
        clients = [self.clients[k] for k in rows]
        grads = _per_example_gradients(losses, layers, self.names)
        bound = torch.tensor([c.max_grad_norm for c in clients], device=losses.device)[owner]
        if self.clipping == "flat":
            norms = torch.stack([g.flatten(1).norm(2, dim=-1) for g in grads.values()], dim=1).norm(2, dim=1)
            factors = dict.fromkeys(grads, (bound / (norms + 1e-6)).clamp(max=1.0))
        else:
            factors = {
                name: (bound / (g.norm(2, dim=tuple(range(1, g.ndim))) + 1e-6)).clamp(max=1.0)
                for name, g in grads.items()
            }
        sizes = torch.tensor([c.plan.batch_size for c in clients], device=losses.device, dtype=losses.dtype)
        noised = {}
        for name, g in grads.items():
            clipped = torch.einsum("i,i...->i...", factors[name], g)
            summed = g.new_zeros(len(clients), *g.shape[1:]).index_add(0, owner, clipped)
            noise = torch.stack([_noise(c, summed[0]) for c in clients])
            noised[name] = (summed + noise) / sizes.view(-1, *[1] * (g.ndim - 1))
        return noised


def _noise(client: DPClient, reference: Tensor) -> Tensor:
    """One Gaussian draw shaped as ``reference`` from the client's generator (none for std 0), as Opacus draws it."""
    std = client.plan.noise_std
    if std == 0:
        return torch.zeros_like(reference)
    shape, device, dtype = reference.shape, reference.device, reference.dtype
    return torch.normal(mean=0, std=std, size=shape, device=device, generator=client.generator, dtype=dtype)


def _per_example_gradients(
    losses: Tensor, layers: Mapping[str, StackedLayer], names: Sequence[str]
) -> dict[str, Tensor]:
    """Each laid example's gradient of its own loss for every parameter in ``names``, from the stacked layers'
    recorded inputs and the gradient of ``losses.sum()`` at their outputs (a layer used twice adds both uses)."""
    records = [(name, layer, x, out, version) for name, layer in layers.items() for x, out, version in layer.records]
    for name, _, _, out, version in records:
        if out._version != version:
            raise ValueError(
                f"the output of {name} was changed in place after the layer ran (an in-place activation?); "
                "per-example DP needs it unchanged (loop.vectorize=false avoids it)."
            )
    outputs = torch.autograd.grad(losses.sum(), [r[3] for r in records], allow_unused=True)
    wanted, grads = set(names), {}
    for (name, layer, x, out, _), grad_out in zip(records, outputs, strict=True):
        grad_out = torch.zeros_like(out) if grad_out is None else grad_out
        for key, value in layer.per_example_gradients(x, grad_out).items():
            full = f"{name}.{key}"
            if full in wanted:
                grads[full] = grads[full] + value if full in grads else value
    missing = [name for name in names if name not in grads]
    if missing:
        raise ValueError(f"no per-example gradient of {missing}: the stacked pass did not use them.")
    for layer in layers.values():
        layer.records = None
    return {name: grads[name] for name in names}
