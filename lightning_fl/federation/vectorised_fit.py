"""The vectorised inner fit: K plain clients' local training as one grouped computation per optimiser step.

Client ``k``'s copy of every parameter is row ``k`` of a ``(K, ...)`` tensor. A copy of the model whose ``Conv2d`` and
``Linear`` layers are replaced by their stacked forms (:class:`StackedConv2d`: one grouped convolution with
``groups = K``; :class:`StackedLinear`: one batched matrix product) runs the model's own ``forward`` and
``per_example_loss`` once on the K clients' batches laid end to end (client-major, ``K * B`` examples), so the
forward, the loss and the backward of all K clients are one pass; :class:`~.vectorised_optim.StackedOptimizer`
then updates every client as its own ``torch.optim`` optimiser would. This is the grouped execution that
``torch.func.vmap`` performs for a convolution with batched weights, here in the channels-last layout, which oneDNN
runs faster on a CPU than the NCHW grouped convolution of ``vmap`` (docs/performance.md).

Clients train for different numbers of steps (different data sizes): they are ordered longest first, so the clients
still training at step ``t`` are a prefix ``[:n_t]`` of the stack and only those rows take part; a finished client's
parameters and optimiser state are not touched. Within a step, a client's shorter batch (its last one) is padded
with copies of its first example of weight 0, and its loss is the mean over its real examples, as the sequential
fit's mean loss over the shorter batch.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_fl.federation.vectorised_optim import StackedOptimizer

__all__ = [
    "ClientBatches",
    "StackedConv2d",
    "StackedLinear",
    "StackedModel",
    "StackedOutcome",
    "fit_stacked",
    "stacked_copy",
]


class _Stacked(nn.Module):
    """A layer whose weights are ``rows`` clients' copies, set before each step by :func:`fit_stacked`."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = 1
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None


class StackedConv2d(_Stacked):
    """``nn.Conv2d`` for ``rows`` clients at once: input ``(rows * B, C, H, W)``, weight ``(rows, O, C/g, kh, kw)``."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups

    def forward(self, x: Tensor) -> Tensor:
        n, (total, channels, height, width) = self.rows, x.shape
        batch = total // n
        # one copy in: (n, B, C, H, W) to the grouped input (B, n*C, H, W) stored channels-last, (B, H, W, n, C)
        grouped = x.view(n, batch, channels, height, width).permute(1, 3, 4, 0, 2).contiguous()
        grouped = grouped.view(batch, height, width, n * channels).permute(0, 3, 1, 2)
        weight = self.weight.reshape(-1, *self.weight.shape[2:]).contiguous(memory_format=torch.channels_last)
        bias = None if self.bias is None else self.bias.reshape(-1)
        out = F.conv2d(grouped, weight, bias, self.stride, self.padding, self.dilation, n * self.groups)
        # one copy out: (B, H', W', n, O) to (n, B, H', W', O), i.e. (n*B, O, H', W') stored channels-last
        side = out.shape[2:]
        out = out.permute(0, 2, 3, 1).reshape(batch, *side, n, -1).permute(3, 0, 1, 2, 4).contiguous()
        return out.view(total, *side, -1).permute(0, 3, 1, 2)


class StackedLinear(_Stacked):
    """``nn.Linear`` for ``rows`` clients at once: input ``(rows * B, ..., F)``, weight ``(rows, O, F)``."""

    def forward(self, x: Tensor) -> Tensor:
        n, lead = self.rows, x.shape[:-1]
        flat = x.reshape(n, -1, x.shape[-1])
        if self.bias is None:
            out = torch.bmm(flat, self.weight.transpose(1, 2))
        else:
            out = torch.baddbmm(self.bias.unsqueeze(1), flat, self.weight.transpose(1, 2))
        return out.reshape(*lead, -1)


STACKED_LAYERS: dict[type[nn.Module], type[_Stacked]] = {nn.Conv2d: StackedConv2d, nn.Linear: StackedLinear}
"""The layers with a stacked form (exact types: a subclass may compute something else)."""


@dataclass
class StackedModel:
    """A copy of a model whose ``Conv2d`` / ``Linear`` layers are stacked, and those layers by module name
    (``"backbone.fc"``: its parameters are ``"backbone.fc.weight"`` and ``"backbone.fc.bias"``)."""

    module: L.LightningModule
    layers: dict[str, _Stacked]


def stacked_copy(model: L.LightningModule) -> StackedModel:
    """The :class:`StackedModel` of ``model``, built once and reused for every round (it holds no client's state)."""
    clone = copy.deepcopy(model)
    layers: dict[str, _Stacked] = {}
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
) -> list[StackedOutcome]:
    """Train ``len(starts)`` clients of ``model`` at once, client ``k`` from its parameters ``starts[k]`` on
    ``data[k]`` (the stacked copy of a model that :func:`~.vectorised_contract.vectorised_refusal` passes).

    Returns:
        one outcome per client, in the order of ``starts``; trained parameters on the CPU.
    """
    clone, layers = model.module, model.layers
    clone.to(device).train()
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
            losses, sizes = _client_losses(clone, layers, rows, [data[k].batches[t] for k in order[:n]], device)
            grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
            optimizer.step(params, dict(zip(leaves, grads, strict=True)), active=n, step=t + 1)
            last = torch.tensor([data[k].epochs[t] == e for k, e in zip(order[:n], last_epoch, strict=False)])
            last = last.to(device)
            total[:n] += torch.where(last, losses.detach() * sizes, 0.0)
            count[:n] += torch.where(last, sizes, 0.0)
    outcomes: list[StackedOutcome | None] = [None] * len(order)
    for row, k in enumerate(order):
        state = {name: value[row].detach().cpu() for name, value in params.items()}
        loss = float(total[row] / count[row]) if count[row] > 0 else float("nan")
        outcomes[k] = StackedOutcome(state, loss, steps[row], last_epoch[row] + 1 if steps[row] else 0)
    return outcomes


PAD_RATIO = 0.75
"""Clients whose batches of a step are at least this fraction of the longest one in their group share one grouped
pass (their batches padded to it); shorter ones start another group: at most a quarter of a pass is padding."""


def _client_losses(
    model: L.LightningModule, layers: dict[str, _Stacked], rows: dict[str, Tensor], batches: Sequence[Any], device
) -> tuple[Tensor, Tensor]:
    """Each client's mean loss over its batch of this step (row ``i``: ``batches[i]`` with parameters ``rows[.][i]``),
    and its batch size; clients of similar batch sizes run as one grouped pass (see :data:`PAD_RATIO`)."""
    sizes = [_length(b) for b in batches]
    parts, placed = [], []
    for group in _groups(sizes):
        index = None if group == list(range(len(sizes))) else torch.tensor(group, device=device)
        for name, layer in layers.items():
            layer.rows = len(group)
            layer.weight = _take(rows[f"{name}.weight"], index)
            layer.bias = _take(rows[f"{name}.bias"], index) if f"{name}.bias" in rows else None
        batch, weights = _stack_batches([batches[i] for i in group], device)
        losses = model.per_example_loss(batch)
        if losses.shape != weights.reshape(-1).shape:
            raise ValueError(
                f"{type(model).__name__}.per_example_loss returned shape {tuple(losses.shape)} for {weights.numel()} "
                "examples; it must return one loss per example (loop.vectorize=false avoids it)."
            )
        parts.append((losses.view(weights.shape) * weights).sum(1) / weights.sum(1))
        placed.extend(group)
    inverse = torch.empty(len(placed), dtype=torch.long)
    inverse[torch.tensor(placed)] = torch.arange(len(placed))
    losses = torch.cat(parts) if len(parts) > 1 else parts[0]
    return losses[inverse.to(device)] if placed != sorted(placed) else losses, torch.tensor(sizes, device=device)


def _groups(sizes: Sequence[int]) -> list[list[int]]:
    """Row indices grouped greedily, longest batch first, so each group's batches are >= ``PAD_RATIO`` of its
    longest (one group, in row order, when all fit)."""
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and sizes[i] >= PAD_RATIO * sizes[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [sorted(g) for g in groups]


def _take(stacked: Tensor, index: Tensor | None) -> Tensor:
    return stacked if index is None else stacked.index_select(0, index)


def _stack_batches(batches: Sequence[Any], device: torch.device) -> tuple[Any, Tensor]:
    """The clients' batches laid end to end (each padded to the longest with copies of its first example) and the
    ``(clients, longest)`` weights, 1 for a real example and 0 for padding."""
    sizes = [_length(b) for b in batches]
    longest = max(sizes)
    weights = torch.tensor([[1.0] * s + [0.0] * (longest - s) for s in sizes], device=device)

    def stack(fields: Sequence[Tensor]) -> Tensor:
        padded = [
            torch.cat([f, f[:1].expand(longest - len(f), *f.shape[1:])]) if len(f) < longest else f for f in fields
        ]
        return torch.cat(padded).to(device, non_blocking=True)

    first = batches[0]
    if isinstance(first, Tensor):
        return stack(batches), weights
    return type(first)(stack(fields) for fields in zip(*batches, strict=True)), weights


def _length(batch: Any) -> int:
    if isinstance(batch, Tensor):
        return len(batch)
    if isinstance(batch, (tuple, list)) and batch and all(isinstance(f, Tensor) for f in batch):
        return len(batch[0])
    raise TypeError(
        f"a vectorised client batch must be a tensor or a tuple/list of tensors, got {type(batch).__name__}; "
        "set loop.vectorize=false for this data."
    )
