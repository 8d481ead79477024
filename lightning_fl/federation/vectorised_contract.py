"""Which clients the vectorised inner fit trains, on which device, and when ``loop.vectorize="auto"`` uses it.

A client qualifies when the lean (Fabric) inner fit would train it (:func:`~.fabric_fit.options_need_trainer` and
:func:`~.fabric_fit.model_needs_trainer`; the device may be a GPU) and its model keeps the training contract:

* ``per_example_loss(batch) -> Tensor``: the loss of each example of ``batch`` (shape ``(len(batch),)``), a pure
  function of the module's parameters and the batch; ``training_step`` returns its mean. The vectorised fit
  reports as the update's loss the sample-weighted mean of the batch losses of the client's last epoch (what
  ``ImageClassifier`` logs as ``train_loss``); the epoch hooks and ``training_step``'s logging are not run, so they
  may only compute that loss.
* every parameter lives in an ``nn.Conv2d`` or ``nn.Linear`` (exact types) and the forward treats the examples of a
  batch independently (no BatchNorm: its batch statistics mix examples and it updates running statistics in the
  step); no persistent or private buffers (they would differ per client); one ``torch.optim.SGD`` or
  ``torch.optim.Adam`` (:func:`~.vectorised_optim.stacked_optimizer_refusal`).

Dropout qualifies: a dropout layer of the stacked pass draws an independent mask for every example (Srivastava et
al., JMLR 2014, Sec. 4), so each client's examples get their own independent draws, as in its own fit; the draws come
from the round's seeded generator, not each client's own stream, so a dropout model's vectorised history equals the
sequential one in distribution, not to float tolerance.

Per-example DP qualifies: a client whose only Trainer callback is a seeded ``PerExampleDP`` (``ClientDPSGD``,
``FedCDP``) is clipped and noised per example on the stacked pass as its own fit would be (:mod:`~.vectorised_dp`);
any other client callback sends the round to the Trainer path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import lightning as L
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from lightning_fl.federation.fabric_fit import model_needs_trainer, options_need_trainer
from lightning_fl.federation.vectorised_dp import dp_callbacks_refusal, dp_model_refusal, per_example_dp
from lightning_fl.federation.vectorised_layers import STACKED_LAYERS
from lightning_fl.federation.vectorised_optim import stacked_optimizer_refusal
from lightning_fl.private import private_state

__all__ = ["AUTO_MAX_PARAMETERS", "Vectorize", "use_vectorised", "vectorised_device", "vectorised_refusal"]

Vectorize = bool | Literal["auto"]

AUTO_MAX_PARAMETERS = 100_000
"""``loop.vectorize="auto"`` stacks a model on a CPU only up to this many parameters. On a CPU stacking saves the
sequential fit's per-step overhead, not arithmetic (each client's layers still run on its own examples), so it pays
where a step is small: measured faster for the 15k-parameter DLG LeNet and the 62k-parameter LeNet-5, slower for the
265k-parameter MLP, whose step is mostly its own matrix products and optimiser update (docs/performance.md). On a GPU
there is no bound."""

_DEVICE_OPTIONS = ("accelerator", "devices")


def vectorised_refusal(
    model: L.LightningModule, *, options: Mapping[str, Any], callbacks: Sequence[L.Callback] = ()
) -> str | None:
    """Why the vectorised fit cannot train a client of ``model`` with these ``loop.trainer`` ``options`` and client
    ``callbacks`` (one line), else ``None``.

    Example:
        >>> from lightning_fl import ImageClassifier
        >>> vectorised_refusal(ImageClassifier("lenet_dlg"), options={"accelerator": "cpu"}) is None
        True
        >>> vectorised_refusal(ImageClassifier("resnet20"), options={"accelerator": "cpu"})[:40]
        'backbone.bn1 is BatchNorm2d: its batch s'
    """
    if vectorised_device(options) is None:
        return f"loop.trainer devices={options.get('devices')!r}: the vectorised fit runs on one device"
    relaxed = {k: v for k, v in options.items() if k not in _DEVICE_OPTIONS}
    dp = dp_model_refusal(model) if per_example_dp(callbacks) else None
    refusal = options_need_trainer(relaxed, ()) or dp_callbacks_refusal(callbacks) or dp
    return refusal or model_needs_trainer(model) or _model_refusal(model)


def _model_refusal(model: L.LightningModule) -> str | None:
    name = type(model).__name__
    if not callable(getattr(model, "per_example_loss", None)):
        return f"{name} defines no per_example_loss(batch), the vectorised training contract"
    for path, module in model.named_modules():
        where = path or name
        if isinstance(module, _BatchNorm):
            return f"{where} is {type(module).__name__}: its batch statistics mix examples and it updates buffers"
        if isinstance(module, nn.Conv2d) and module.padding_mode != "zeros":
            return f"{where} pads with {module.padding_mode!r}: only zero padding has a stacked form"
        own = [n for n, _ in module.named_parameters(recurse=False)]
        if own and type(module) not in STACKED_LAYERS:
            return f"{where} ({type(module).__name__}) holds parameters {own}: only Conv2d and Linear are stacked"
    persistent = sorted(k for k in model.state_dict() if k not in dict(model.named_parameters()))
    if persistent:
        return f"{name} has persistent buffers {persistent[:3]}: they would differ per client"
    private_buffers = sorted(set(private_state(model)) - set(dict(model.named_parameters())))
    if private_buffers:
        return f"{name} has private buffers {private_buffers[:3]}: they would differ per client"
    return stacked_optimizer_refusal(model.configure_optimizers())


def vectorised_device(options: Mapping[str, Any]) -> torch.device | None:
    """The one device ``loop.trainer``'s ``accelerator`` and ``devices`` name (``None`` when they name several).

    Example:
        >>> vectorised_device({"accelerator": "cpu", "devices": 1})
        device(type='cpu')
    """
    accelerator, devices = options.get("accelerator", "auto"), options.get("devices", "auto")
    if isinstance(devices, (list, tuple)):
        if len(devices) != 1:
            return None
        index = int(devices[0])
    elif devices in (1, "1", "auto"):
        index = 0
    else:
        return None
    cuda = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    return torch.device("cuda", index) if cuda else torch.device("cpu")


def use_vectorised(
    mode: Vectorize, refusal: str | None, *, clients: int, parameters: int, device: torch.device
) -> tuple[bool, str]:
    """Whether a round of ``clients`` clients trains vectorised, and why (one line).

    ``True`` stacks every qualifying round; ``"auto"`` stacks it when at least 2 clients train and the model is
    small enough for stacking to pay on a CPU (:data:`AUTO_MAX_PARAMETERS`; any size on a GPU).

    Example:
        >>> use_vectorised("auto", None, clients=5, parameters=15_000, device=torch.device("cpu"))
        (True, 'auto: 5 clients of a 15000-parameter model on cpu')
    """
    if mode is False:
        return False, "loop.vectorize=false"
    if refusal is not None:
        return False, refusal
    if mode == "auto" and clients < 2:
        return False, "auto: fewer than 2 clients in the round"
    if mode == "auto" and device.type == "cpu" and parameters > AUTO_MAX_PARAMETERS:
        return False, f"auto: {parameters} parameters > {AUTO_MAX_PARAMETERS} on a CPU"
    return True, f"{'auto: ' if mode == 'auto' else ''}{clients} clients of a {parameters}-parameter model on {device}"
