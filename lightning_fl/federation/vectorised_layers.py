"""The stacked forms of ``Conv2d`` and ``Linear``: K clients' copies of a layer as one module, row ``k`` of each
parameter being client ``k``'s, applied to the K clients' batches laid end to end.

Inside a stacked layer each client's rows meet only that client's examples: on a CPU one oneDNN convolution per client
in the channels-last layout (faster there than the grouped convolution that ``torch.func.vmap`` gives a convolution
with batched weights: docs/performance.md); on a GPU the step's batches are padded to the longest and each
convolution is one grouped convolution (``groups = K``). The layers also keep what the per-example gradients of
DP-SGD need (:mod:`~.vectorised_dp`).
"""

from __future__ import annotations

import abc
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["STACKED_LAYERS", "StackedConv2d", "StackedLayer", "StackedLinear"]


class StackedLayer(nn.Module, abc.ABC):
    """A layer whose weights are the clients' copies (row ``k``: client ``k``, who has ``sizes[k]`` examples of the
    input, laid end to end), set before each step by :func:`fit_stacked`."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = [1]
        self.grouped = False
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None
        self.records: list[tuple[Tensor, Tensor, int]] | None = None

    def _recorded(self, x: Tensor, out: Tensor) -> Tensor:
        """``out``; with ``records`` on (per-example DP), its input and output are kept for
        :meth:`per_example_gradients`, with the output's version (an in-place change afterwards would be seen)."""
        if self.records is not None:
            self.records.append((x, out, out._version))
        return out

    @abc.abstractmethod
    def per_example_gradients(self, x: Tensor, grad_out: Tensor) -> dict[str, Tensor]:
        """Each example's gradient of this layer's ``weight`` and ``bias`` (``(examples, *shape)``), given the layer's
        input ``x`` and the gradient ``grad_out`` of the example's own loss at its output.

        Opacus' formulas (``opacus.grad_sample``), written for the stacked layers rather than called: Opacus' grad
        samplers take an ``nn.Conv2d``/``nn.Linear`` module, return a one-row result for an empty batch (a stacked
        step's Poisson batches may all be empty) and expand a grouped convolution to ``groups**2`` blocks."""

    def _equal(self) -> bool:
        return all(size == self.sizes[0] for size in self.sizes)

    def _each(self, x: Tensor, layer) -> Tensor:
        """``layer(x_k, weight_k, bias_k)`` for each client's examples ``x_k``, laid end to end again."""
        biases = [None] * len(self.sizes) if self.bias is None else self.bias.unbind(0)
        parts = zip(x.split(self.sizes), self.weight.unbind(0), biases, strict=True)
        return torch.cat([layer(part, weight, bias) for part, weight, bias in parts])


class StackedConv2d(StackedLayer):
    """``nn.Conv2d`` for the clients at once: input ``(sum(sizes), C, H, W)``, weight ``(clients, O, C/g, kh, kw)``.

    On a CPU each client's convolution runs on its own examples in the channels-last layout (faster there than one
    grouped convolution); with ``grouped`` (a GPU) and equal sizes, the clients' convolutions are one
    grouped convolution with ``groups = clients``, the form ``torch.func.vmap`` gives a convolution with batched
    weights, here channels-last."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups

    def forward(self, x: Tensor) -> Tensor:
        if self.grouped and self._equal():
            return self._recorded(x, self._grouped(x))
        return self._recorded(x, self._each(x.contiguous(memory_format=torch.channels_last), self._conv))

    def per_example_gradients(self, x: Tensor, grad_out: Tensor) -> dict[str, Tensor]:
        """The per-example gradients of a convolution as Opacus computes them: the input's patches
        (``F.unfold``) times the output gradient at each position, summed over positions, per group."""
        shape, n, groups = self.weight.shape[1:], len(x), self.groups
        patches = F.unfold(x, shape[-2:], dilation=self.dilation, padding=self.padding, stride=self.stride)
        patches = patches.reshape(n, groups, patches.shape[1] // groups, patches.shape[-1])
        grads = grad_out.reshape(n, groups, shape[0] // groups, patches.shape[-1])
        weight = torch.einsum("ngol,ngkl->ngok", grads, patches).reshape(n, *shape)
        return {"weight": weight, "bias": grad_out.sum((2, 3))}

    def _conv(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def _grouped(self, x: Tensor) -> Tensor:
        n, (total, channels, height, width) = len(self.sizes), x.shape
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


class StackedLinear(StackedLayer):
    """``nn.Linear`` for the clients at once: input ``(sum(sizes), ..., F)``, weight ``(clients, O, F)``; one batched
    matrix product when the clients' sizes are equal, else one product per client."""

    def forward(self, x: Tensor) -> Tensor:
        if not self._equal() or not self.sizes[0]:
            return self._recorded(x, self._each(x, F.linear))
        n, lead = len(self.sizes), x.shape[:-1]
        flat = x.reshape(n, -1, x.shape[-1])
        if self.bias is None:
            out = torch.bmm(flat, self.weight.transpose(1, 2))
        else:
            out = torch.baddbmm(self.bias.unsqueeze(1), flat, self.weight.transpose(1, 2))
        return self._recorded(x, out.reshape(*lead, -1))

    def per_example_gradients(self, x: Tensor, grad_out: Tensor) -> dict[str, Tensor]:
        """The per-example gradients of a linear layer: the outer product of output gradient and input, summed over
        any dimensions between the example and the features."""
        n, positions = len(x), math.prod(x.shape[1:-1])  # sizes spelt out: a step's batches may all be empty
        grads, inputs = grad_out.reshape(n, positions, grad_out.shape[-1]), x.reshape(n, positions, x.shape[-1])
        return {"weight": torch.einsum("nlo,nli->noi", grads, inputs), "bias": grads.sum(1)}


STACKED_LAYERS: dict[type[nn.Module], type[StackedLayer]] = {nn.Conv2d: StackedConv2d, nn.Linear: StackedLinear}
"""The layers with a stacked form (exact types: a subclass may compute something else)."""
