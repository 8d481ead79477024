"""The vectorised inner fit: K plain clients' local training as one forward and one backward per optimiser step.

Client ``k``'s copy of every parameter is row ``k`` of a ``(K, ...)`` tensor. A copy of the model whose ``Conv2d`` and
``Linear`` layers are replaced by their stacked forms (:mod:`~.vectorised_layers`) runs the
model's own ``forward`` and ``per_example_loss`` once on the K clients' batches laid end to end (client-major; on a
CPU each batch as it is), so the forward, the loss and the backward of all K clients are one autograd pass with no
per-client optimiser loop, closure or hooks; :class:`~.vectorised_optim.StackedOptimizer`
then updates every client as its own ``torch.optim`` optimiser would.
Each client's rows meet only that client's examples (:mod:`~.vectorised_layers` says how, on a CPU and on a GPU).

Clients train for different numbers of steps (different data sizes): they are ordered longest first, so the clients
still training at step ``t`` are a prefix ``[:n_t]`` of the stack and only those rows take part; a finished client's
parameters and optimiser state are not touched. Each client's loss is the mean over its own batch, as in the
sequential fit.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from torch import Tensor

from lightning_fl.federation.vectorised_layers import STACKED_LAYERS, StackedConv2d, StackedLayer
from lightning_fl.federation.vectorised_optim import StackedOptimizer

if TYPE_CHECKING:
    from lightning_fl.federation.vectorised_dp import StackedDPSGD

__all__ = [
    "ClientBatches",
    "StackedModel",
    "StackedOutcome",
    "fit_stacked",
    "stacked_copy",
]


@dataclass
class StackedModel:
    """A copy of a model whose ``Conv2d`` / ``Linear`` layers are stacked, and those layers by module name
    (``"backbone.fc"``: its parameters are ``"backbone.fc.weight"`` and ``"backbone.fc.bias"``)."""

    module: L.LightningModule
    layers: dict[str, StackedLayer]


def stacked_copy(model: L.LightningModule) -> StackedModel:
    """The :class:`StackedModel` of ``model``, built once and reused for every round (it holds no client's state)."""
    clone = copy.deepcopy(model)
    layers: dict[str, StackedLayer] = {}
    for name, module in list(clone.named_modules()):
        stacked_type = STACKED_LAYERS.get(type(module))
        if stacked_type is None:
            continue
        layer = stacked_type(module) if stacked_type is StackedConv2d else stacked_type()
        parent_name, _, child = name.rpartition(".")
        setattr(clone.get_submodule(parent_name), child, layer)
        layers[name] = layer
    return StackedModel(clone, layers)


@dataclass
class ClientBatches:
    """One client's local training data, one batch per optimiser step, and the 0-based epoch of each step."""

    batches: list[Any]
    epochs: list[int]


@dataclass
class StackedOutcome:
    """What one client's vectorised fit reports: its trained parameters, the sample-weighted mean training loss of
    its last epoch (what ``ImageClassifier`` logs as ``train_loss``), and its optimiser steps and epochs."""

    state: dict[str, Tensor]
    loss: float
    steps: int
    epochs: int


def fit_stacked(
    model: StackedModel,
    starts: Sequence[dict[str, Tensor]],
    data: Sequence[ClientBatches],
    optimizer: StackedOptimizer,
    *,
    device: torch.device,
    grouped: bool | None = None,
    dp: StackedDPSGD | None = None,
) -> list[StackedOutcome]:
    """Train ``len(starts)`` clients of ``model`` at once, client ``k`` from its parameters ``starts[k]`` on
    ``data[k]`` (the stacked copy of a model that :func:`~.vectorised_contract.vectorised_refusal` passes).

    ``grouped`` (default: on a GPU) pads each step's batches to the longest with weight-0 copies of their first
    example, so every convolution of the step is one grouped convolution; otherwise each client's convolution runs on
    its own examples. With ``dp`` each client's gradient is its clipped, noised per-example gradients instead of the
    gradient of its mean loss (per-example DP-SGD, :class:`~.vectorised_dp.StackedDPSGD`); its batches may then be
    empty (Poisson sampling).

    Returns:
        one outcome per client, in the order of ``starts``; trained parameters on the CPU.
    """
    clone, layers = model.module, model.layers
    clone.to(device).train()
    grouped = device.type != "cpu" if grouped is None else grouped
    for layer in layers.values():
        layer.grouped = grouped
    order = sorted(range(len(starts)), key=lambda k: -len(data[k].batches))
    params = {name: torch.stack([starts[k][name] for k in order]).to(device) for name in starts[0]}
    total, count = torch.zeros(len(order), device=device), torch.zeros(len(order), device=device)
    steps = [len(data[k].batches) for k in order]
    last_epoch = [data[k].epochs[-1] if data[k].epochs else 0 for k in order]
    with torch.enable_grad():
        for t in range(steps[0] if steps else 0):
            n = sum(s > t for s in steps)
            leaves = {name: params[name][:n].detach().requires_grad_() for name in optimizer.names}
            rows = {name: leaves.get(name, value[:n]) for name, value in params.items()}
            batches = [data[k].batches[t] for k in order[:n]]
            record = dp is not None
            losses, owner, sizes = _example_losses(clone, layers, rows, batches, device, pad=grouped, record=record)
            sums = torch.zeros(n, device=device).index_add(0, owner, losses)
            if dp is None:
                grads = torch.autograd.grad((sums / sizes.clamp(min=1)).sum(), list(leaves.values()))
                optimizer.step(params, dict(zip(leaves, grads, strict=True)), active=n, step=t + 1)
            else:
                optimizer.step(params, dp.gradients(order[:n], losses, owner, layers), active=n, step=t + 1)
            last = torch.tensor([data[k].epochs[t] == e for k, e in zip(order[:n], last_epoch, strict=False)])
            last = last.to(device)
            total[:n] += torch.where(last, sums.detach(), 0.0)
            count[:n] += torch.where(last, sizes, 0.0)
    outcomes: list[StackedOutcome | None] = [None] * len(order)
    for row, k in enumerate(order):
        state = {name: value[row].detach().cpu() for name, value in params.items()}
        loss = float(total[row] / count[row]) if count[row] > 0 else float("nan")
        outcomes[k] = StackedOutcome(state, loss, steps[row], last_epoch[row] + 1 if steps[row] else 0)
    return outcomes


def _example_losses(
    model: L.LightningModule,
    layers: dict[str, StackedLayer],
    rows: dict[str, Tensor],
    batches: Sequence[Any],
    device: torch.device,
    *,
    pad: bool,
    record: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """The loss of each example of the clients' batches of this step (row ``i``: ``batches[i]`` with parameters
    ``rows[.][i]``), laid end to end through one pass of the stacked model as they are or (``pad``) each padded to the
    longest with copies of its first example, whose losses are 0; the client row of each laid example; and each
    client's batch size. ``record`` keeps each stacked layer's input and output (per-example DP)."""
    sizes = [_length(b) for b in batches]
    longest = max(sizes)
    laid = [_padded(b, longest) for b in batches] if pad else batches
    for name, layer in layers.items():
        layer.sizes = [longest] * len(sizes) if pad else sizes
        layer.weight = rows[f"{name}.weight"]
        layer.bias = rows.get(f"{name}.bias")
        layer.records = [] if record else None
    first = laid[0]
    if isinstance(first, Tensor):
        batch = torch.cat(laid).to(device, non_blocking=True)
    else:
        batch = type(first)(torch.cat(fields).to(device, non_blocking=True) for fields in zip(*laid, strict=True))
    losses = model.per_example_loss(batch)
    examples = longest * len(sizes) if pad else sum(sizes)
    if losses.shape != (examples,):
        raise ValueError(
            f"{type(model).__name__}.per_example_loss returned shape {tuple(losses.shape)} for {examples} "
            "examples; it must return one loss per example (loop.vectorize=false avoids it)."
        )
    counts = torch.tensor(sizes, device=device)
    owner = torch.repeat_interleave(torch.arange(len(sizes), device=device), longest if pad else counts)
    if pad:
        real = (torch.arange(longest, device=device) < counts.unsqueeze(1)).flatten()
        losses = torch.where(real, losses, 0.0)
    return losses, owner, counts


def _padded(batch: Any, longest: int) -> Any:
    """``batch`` (a tensor or a tuple/list of tensors) with copies of its first example appended up to ``longest``
    (zeros for an empty batch)."""

    def pad(field: Tensor) -> Tensor:
        missing = longest - len(field)
        if not missing:
            return field
        shape = (missing, *field.shape[1:])
        filler = field[:1].expand(shape) if len(field) else field.new_zeros(shape)
        return torch.cat([field, filler])

    return pad(batch) if isinstance(batch, Tensor) else type(batch)(pad(f) for f in batch)


def _length(batch: Any) -> int:
    if isinstance(batch, Tensor):
        return len(batch)
    if isinstance(batch, (tuple, list)) and batch and all(isinstance(f, Tensor) for f in batch):
        return len(batch[0])
    raise TypeError(
        f"a vectorised client batch must be a tensor or a tuple/list of tensors, got {type(batch).__name__}; "
        "set loop.vectorize=false for this data."
    )
