"""Opacus patched for lightning-fl's layers: per-example gradients of whole layers, checks, cleanup.

Opacus' ``GradSampleModule`` hooks every leaf layer; passport and key-lock layers build their weights from private,
batch-free inputs and must be differentiated per example as one unit (``per_example_unit = True``). This module
holds that unit sampler, the hook module that skips such layers, the check of a model's layers against Opacus'
``ModuleValidator`` rules, the noise-multiplier conversion to Opacus' convention, and the removal of what Opacus'
hooks leave behind.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any, Literal

import torch
from opacus import GradSampleModule
from opacus.validators import ModuleValidator
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

__all__ = [
    "Clipping",
    "NoiseScaling",
    "UnitAwareGradSampleModule",
    "UnitGradSampler",
    "check_per_example_model",
    "is_unit",
    "opacus_noise_multiplier",
    "strip_opacus_state",
]

_OPACUS_PARAM_ATTRS = ("grad_sample", "summed_grad", "_forward_counter")
_OPACUS_MODULE_ATTRS = ("activations", "max_batch_len", "_forward_counter")

Clipping = Literal["per_layer", "flat"]
NoiseScaling = Literal["per_batch", "per_example"]
r"""How many Gaussian draws of std :math:`\sigma C` go into a batch's summed clipped gradient: ``per_batch`` one
(DP-SGD of Abadi et al.; Opacus; 2DP-FL; Fed-CDP's released code), ``per_example`` one per example (Fed-CDP Alg. 2
line 14 as printed: std :math:`\sigma C\sqrt B` on the sum)."""


def opacus_noise_multiplier(
    *, noise_multiplier: float, clipping: Clipping, noise_scaling: NoiseScaling, num_tensors: int, batch_size: int
) -> float:
    r"""The multiplier to give Opacus so that its noise equals the noise a paper prescribes.

    Opacus adds one draw of std ``multiplier * total_clip_norm`` to the *sum* of clipped per-example gradients
    and divides by the batch size B. With per-layer clipping of M tensors to C each, the total clip norm is
    :math:`C\sqrt M`. Fed-CDP (Alg. 2, line 14) adds :math:`\mathcal N(0, \sigma^2C^2)` per layer to *each*
    example before averaging (``noise_scaling="per_example"``: std :math:`\sigma C/\sqrt B` on the mean); the
    authors' code and Abadi et al.'s DP-SGD add one draw per batch (``"per_batch"``: std :math:`\sigma C/B`).

    Example:
        >>> opacus_noise_multiplier(noise_multiplier=6.0, clipping="per_layer", noise_scaling="per_example",
        ...                         num_tensors=4, batch_size=16)
        12.0
        >>> opacus_noise_multiplier(noise_multiplier=1.0, clipping="flat", noise_scaling="per_batch",
        ...                         num_tensors=4, batch_size=16)
        1.0
    """
    per_tensor = 1.0 / math.sqrt(num_tensors) if clipping == "per_layer" else 1.0
    per_example = math.sqrt(batch_size) if noise_scaling == "per_example" else 1.0
    return noise_multiplier * per_tensor * per_example


class UnitGradSampler:
    """Per-example gradients of one layer that Opacus' layer-wise hooks cannot split (a passport or key-lock layer).

    Such a layer builds its weights from private inputs without a batch dimension (passports, a key) through
    sub-layers that Opacus would hook one by one. Here the whole layer is one function of the example:
    the backward hook replays it on each example with ``torch.func`` (``vmap`` of ``grad`` of
    :math:`\\langle f_\\theta(x_j), \\partial L/\\partial f(x_j)\\rangle`) and stores ``grad_sample`` as Opacus does.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.replica = copy.deepcopy(module).to("meta")  # structure only; weights come from functional_call
        self.inputs: list[Tensor] = []
        self.handles: list[RemovableHandle] = [
            module.register_forward_hook(self._capture),
            module.register_full_backward_hook(self._per_example_gradients),
        ]

    def _capture(self, module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        if module.training and torch.is_grad_enabled():
            self.inputs.append(inputs[0].detach())

    def _per_example_gradients(self, module: nn.Module, grad_input: Any, grad_output: tuple[Tensor, ...]) -> None:
        inputs = self.inputs.pop()
        backprops = grad_output[0].detach() * inputs.shape[0]  # undo the batch mean: the grad of each example's loss
        params = {n: p for n, p in module.named_parameters() if p.requires_grad}
        buffers = dict(module.named_buffers())

        def inner_product(weights: dict[str, Tensor], x: Tensor, g: Tensor) -> Tensor:
            out = functional_call(self.replica, ({**weights, **buffers},), (x.unsqueeze(0),))
            return (out * g.unsqueeze(0)).sum()

        detached = {n: p.detach() for n, p in params.items()}
        per_example = vmap(grad(inner_product), in_dims=(None, 0, 0))(detached, inputs, backprops)
        for name, p in params.items():
            previous = getattr(p, "grad_sample", None)
            sample = per_example[name]
            if previous is None:
                p.grad_sample = sample
            else:  # gradient accumulation over several batches: a list, as Opacus keeps it
                p.grad_sample = [*previous, sample] if isinstance(previous, list) else [previous, sample]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.inputs.clear()


def is_unit(module: nn.Module) -> bool:
    return bool(getattr(module, "per_example_unit", False))


class UnitAwareGradSampleModule(GradSampleModule):
    """Opacus' per-sample-gradient hooks everywhere except inside layers marked ``per_example_unit``."""

    @override
    def iterate_submodules(self, module: nn.Module) -> Iterator[nn.Module]:
        if is_unit(module):
            return
        yield from super().iterate_submodules(module)


def _opacus_errors(layer: nn.Module) -> list[Exception]:
    """What Opacus' :class:`ModuleValidator` rule for ``layer``'s class (or a base class) objects to; ``[]`` when
    none applies (BatchNorm, LSTM/GRU/RNN, MultiheadAttention, InstanceNorm with running statistics have rules)."""
    validator = next(
        (ModuleValidator.VALIDATORS[t] for t in type(layer).__mro__ if t in ModuleValidator.VALIDATORS), None
    )
    return list(validator(layer)) if validator is not None else []


def check_per_example_model(module: nn.Module, *, owner: str = "PerExampleDP") -> None:
    """Raise before training if Opacus cannot give ``module`` per-example gradients, naming the layer and the fix.

    Every layer goes through Opacus' own ``ModuleValidator`` rules, by name (Opacus' ``ModuleValidator.validate``
    does not say which layer failed, and skips layers without trainable parameters, though a BatchNorm without them
    still mixes a batch's examples). Layers marked ``per_example_unit`` (passports, key-locks) are differentiated as
    one unit; a BatchNorm inside one mixes the examples all the same, and is refused with that layer's own fix.

    Args:
        module: the model a DP-SGD fit would train (with the other defences' layers already in place).
        owner: who refuses it, first in the message (``PerExampleDP``, or the defence bundle that runs it).

    Raises:
        ValueError: naming the first layer Opacus cannot handle, its class, why, and the fix.

    Example:
        >>> check_per_example_model(nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4)))
        >>> check_per_example_model(nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)), owner="FedCDP")
        Traceback (most recent call last):
        ...
        ValueError: FedCDP cannot compute per-example gradients through BatchNorm 1 (BatchNorm2d): it mixes the \
examples of a batch; before training call `model = opacus.validators.ModuleValidator.fix(model)` (GroupNorm).
    """
    units = [name for name, m in module.named_modules() if is_unit(m)]
    for name, layer in module.named_modules():
        errors = _opacus_errors(layer)
        if not errors:
            continue
        unit = next((u for u in units if name.startswith(f"{u}.")), None)
        batch_norm = isinstance(layer, nn.modules.batchnorm._BatchNorm)
        if unit is not None and batch_norm:
            raise ValueError(
                f"{owner}: the layer {unit} ({type(module.get_submodule(unit)).__name__}) normalises with "
                "BatchNorm, which mixes the examples of a batch; build it with norm='group' (add_keylock(..., "
                "norm='group'), KeyLocks(norm='group'))."
            )
        if unit is not None:  # differentiated whole by torch.func, not by Opacus' hooks
            continue
        kind = (
            f"BatchNorm {name} ({type(layer).__name__}): it mixes the examples of a batch"
            if batch_norm
            else (f"{name} ({type(layer).__name__}): {' '.join(str(errors[0]).split())}")
        )
        raise ValueError(
            f"{owner} cannot compute per-example gradients through {kind}; before training call "
            "`model = opacus.validators.ModuleValidator.fix(model)` (GroupNorm)."
        )


def strip_opacus_state(module: nn.Module) -> None:
    """Delete the attributes Opacus' hooks leave on ``module``'s parameters and submodules after a fit.

    Opacus keeps per-sample gradients and activations as attributes of the tensors and modules it hooks; a worker
    model that the next client trains (with or without DP) must not carry them over.
    """
    for p in module.parameters():
        for attr in _OPACUS_PARAM_ATTRS:
            if hasattr(p, attr):
                delattr(p, attr)
    for sub in module.modules():
        for attr in _OPACUS_MODULE_ATTRS:
            if attr in sub.__dict__:
                delattr(sub, attr)
