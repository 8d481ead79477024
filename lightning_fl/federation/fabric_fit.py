"""The lean inner fit: a plain client's local training on Lightning Fabric instead of a ``Trainer``.

Why: a small client fit is a few milliseconds of arithmetic, and the ``Trainer``'s construction and per-step hook
dispatch are a large share of it (docs/performance.md, "Loop overhead"). Fabric (Lightning's own "LightningModule
without the Trainer" API) runs the same user code without them: one :class:`FabricFit` per runner, built once, calls
the module's ``configure_optimizers``, ``on_train_epoch_start``, ``training_step`` and ``on_train_epoch_end`` in the
``Trainer``'s order, steps the optimiser through the same closure (``training_step``, ``optimizer.zero_grad()``,
``backward``) and reduces what the module logs with ``self.log`` as the ``Trainer`` would, so that for the same seed
the result is the ``Trainer``'s to the bit.

Only *plain* clients take this path (:func:`options_need_trainer` and :func:`model_needs_trainer` say why a client
does not): no client callbacks (Opacus' ``PerExampleDP``, the gradient tap), automatic optimisation with one
optimiser and no scheduler, fp32 on one CPU device, no ``loop.trainer`` option beyond the quiet defaults, and no
overridden ``LightningModule`` hook other than the four above (a hook the ``Trainer`` would call and this loop would
not changes what the client trains). A module that logs in a form only the ``Trainer`` reduces (a ``Metric`` object,
``on_step`` and ``on_epoch`` together) is trained again on the ``Trainer``, then and for every later client.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torchmetrics import Metric

from lightning_fl.trainers import QUIET_TRAINER

__all__ = ["FabricFit", "FitOutcome", "lean_test", "model_needs_trainer", "options_need_trainer"]

_CALLED = {"forward", "training_step", "configure_optimizers", "on_train_epoch_start", "on_train_epoch_end"}
"""The LightningModule methods a plain client may override: the ones :class:`FabricFit` calls."""

_NOT_IN_FIT = ("validation_step", "test_step", "predict_step", "on_validation", "on_test", "on_predict")
"""Prefixes of hooks a ``Trainer`` never calls in a fit without validation (the loop's inner fits validate nothing)."""

_CALLED_IN_TEST = {"forward", "test_step", "on_test_epoch_start", "on_test_epoch_end"}
"""The LightningModule methods a model tested by :func:`lean_test` may override: the ones it calls."""

_NOT_IN_TEST = (
    "training_step",
    "validation_step",
    "predict_step",
    "on_train",
    "on_validation",
    "on_predict",
    "configure_optimizers",
    "optimizer",
    "backward",
    "on_before_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_after_backward",
    "lr_scheduler",
    "configure_gradient_clipping",
    "clip_gradients",
    "manual_backward",
    "toggle_optimizer",
    "untoggle",
)
"""Prefixes of methods ``Trainer.test`` never calls (it does call the batch-transfer hooks, so those count)."""

_PLAIN_OPTIONS = {**QUIET_TRAINER, "accelerator": "cpu", "devices": 1}


def _overridden_hooks(model: L.LightningModule, *, called: set[str] = _CALLED, skip: tuple = _NOT_IN_FIT) -> list[str]:
    """The ``LightningModule`` methods and hooks ``type(model)`` overrides that a ``Trainer`` fit (or test, with
    ``called`` and ``skip`` of the test) may call and the lean loop does not."""
    base = L.LightningModule
    names = [n for n in dir(base) if not n.startswith("_") and callable(getattr(base, n, None))]
    return sorted(
        n
        for n in names
        if n not in called
        and not n.startswith(skip)
        and inspect.getattr_static(type(model), n, None) is not inspect.getattr_static(base, n)
    )


def options_need_trainer(options: Mapping[str, Any], callbacks: Sequence[Any]) -> str | None:
    """Why the ``Trainer`` options or client ``callbacks`` of a fit need the full ``Trainer`` (one line), else ``None``.

    Example:
        >>> options_need_trainer({**_PLAIN_OPTIONS, "gradient_clip_val": 1.0}, [])
        "loop.trainer sets ['gradient_clip_val']"
    """
    if callbacks:
        return f"client callbacks {sorted({type(cb).__name__ for cb in callbacks})}"
    extra = sorted(k for k in options if k not in _PLAIN_OPTIONS or options[k] != _PLAIN_OPTIONS[k])
    return f"loop.trainer sets {extra}" if extra else None


def model_needs_trainer(model: L.LightningModule, *, stage: str = "fit") -> str | None:
    """Why ``model`` needs the full ``Trainer`` (one line), or ``None`` when :class:`FabricFit` trains it
    (``stage="fit"``) or :func:`lean_test` tests it (``stage="test"``) the same.

    For the fit, calls ``configure_optimizers`` once to see that it returns one optimiser.

    Example:
        >>> from lightning_fl import ImageClassifier
        >>> model_needs_trainer(ImageClassifier("lenet_dlg")) is None
        True
    """
    if stage == "test":
        hooks = _overridden_hooks(model, called=_CALLED_IN_TEST, skip=_NOT_IN_TEST)
        return f"{type(model).__name__} overrides {hooks}" if hooks else None
    if not model.automatic_optimization:
        return "manual optimisation"
    hooks = _overridden_hooks(model)
    if hooks:
        return f"{type(model).__name__} overrides {hooks}"
    reads = _reads_trainer_state(model)
    if reads:
        return reads
    try:
        optimizer = model.configure_optimizers()
    except Exception as error:  # e.g. it reads self.trainer, which only the Trainer path has
        return f"configure_optimizers needs the Trainer ({type(error).__name__}: {error})"
    if not isinstance(optimizer, torch.optim.Optimizer):
        return f"configure_optimizers returns {type(optimizer).__name__}, not one optimiser"
    return None


_TRAINER_STATE = ("current_epoch", "global_step", "self.trainer")
"""What a module may read that only a ``Trainer`` fills in (Fabric leaves ``current_epoch``, ``global_step`` 0)."""


def _reads_trainer_state(model: L.LightningModule) -> str | None:
    """Which of the methods :class:`FabricFit` calls reads the ``Trainer``'s state in its source (one line), else
    ``None``. A source check: code reached only through a helper method is not seen; ``loop.trainer`` options or
    ``ClientRunner.inner_fit = "trainer"`` force the ``Trainer`` for such a module."""
    for name in sorted(_CALLED - {"forward"}):
        method = getattr(type(model), name, None)
        if method is None or getattr(L.LightningModule, name, None) is method:
            continue
        try:
            source = inspect.getsource(method)
        except (OSError, TypeError):  # no source (built in a notebook cell, compiled): assume it reads nothing
            continue
        found = [token for token in _TRAINER_STATE if token in source]
        if found:
            return f"{type(model).__name__}.{name} reads {found}"
    return None


class _Logged:
    """What ``self.log`` / ``self.log_dict`` leave in ``trainer.callback_metrics`` at the end of a ``Trainer`` fit,
    computed as Lightning's result collection does for the forms training and test loops use: a value logged in a
    step on step (the last one) or on epoch (the batch-size-weighted mean of the last epoch, summed in float32 and
    divided by the summed batch sizes, as Lightning does), a torchmetrics ``Metric`` logged on epoch (computed at the
    epoch end, then reset), and a value logged in an epoch hook. Any other form (a ``Metric`` on step, both
    ``on_step`` and ``on_epoch``, another ``reduce_fx``) sets ``unsupported``.

    Args:
        steps_log_on_step: the default of ``on_step`` in a step (``True`` in ``training_step``, ``False`` in
            ``test_step``); ``on_epoch`` defaults to the opposite.
    """

    def __init__(self, *, steps_log_on_step: bool) -> None:
        self.steps_log_on_step = steps_log_on_step
        self.metrics: dict[str, float] = {}
        self.unsupported: str | None = None
        self.not_for_logger: set[str] = set()  # logged with logger=False: not in Trainer.test's results
        self.batch: Any = None  # the batch of the running step; None in epoch hooks
        self._epoch: dict[str, tuple[torch.Tensor, torch.Tensor] | Metric] = {}

    def start_epoch(self) -> None:
        self._epoch = {}

    def end_epoch(self) -> None:
        for name, value in self._epoch.items():
            if isinstance(value, Metric):
                self.metrics[name] = float(value.compute())
                value.reset()
            else:
                self.metrics[name] = float(value[0] / value[1])

    def log_dict(self, dictionary: Mapping[str, Any], **options: Any) -> None:
        for name, value in dictionary.items():
            self.log(name, value, **options)

    def log(
        self,
        name: str,
        value: Any,
        *,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: Any = "mean",
        batch_size: int | None = None,
        logger: bool | None = None,
        **_: Any,
    ) -> None:
        in_step = self.batch is not None
        on_step = (in_step and self.steps_log_on_step) if on_step is None else on_step
        on_epoch = not on_step if on_epoch is None else on_epoch
        if logger is False:
            self.not_for_logger.add(name)
        if isinstance(value, Metric) and on_epoch and not on_step:
            self._epoch[name] = value
            return
        if (
            not isinstance(value, (torch.Tensor, float, int))
            or on_step == on_epoch
            or reduce_fx not in ("mean", torch.mean)
        ):
            self.unsupported = f"self.log({name!r}, ...) with on_step={on_step}, on_epoch={on_epoch}, {reduce_fx=}"
            return
        value = torch.as_tensor(value).detach()
        if value.dtype not in (torch.float32, torch.float64):
            value = value.to(torch.get_default_dtype())
        if on_step:
            self.metrics[name] = float(value)
            return
        if batch_size is None:
            batch_size = _batch_size(self.batch) if in_step else 1
        total, count = self._epoch.get(name, (torch.tensor(0.0, dtype=torch.get_default_dtype()), torch.tensor(0)))
        self._epoch[name] = (total + value * batch_size, count + batch_size)


def _batch_size(batch: Any) -> int:
    """The length of the first tensor in ``batch`` (Lightning's ``extract_batch_size``), 1 if it holds none."""
    size = _first_length(batch)
    return 1 if size is None else size


def _first_length(batch: Any) -> int | None:
    if isinstance(batch, torch.Tensor):
        return 1 if batch.ndim == 0 else len(batch)
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    return next((size for size in map(_first_length, items) if size is not None), None)


@dataclass
class FitOutcome:
    """What a client fit reports, as a ``Trainer`` would: logged metrics, optimiser steps, finished epochs."""

    metrics: dict[str, float]
    global_step: int
    current_epoch: int
    optimizer: torch.optim.Optimizer | None


class FabricFit:
    """Local training of plain clients on one Fabric, built once and reused for every client fit."""

    def __init__(self) -> None:
        self.fabric = L.Fabric(accelerator="cpu", devices=1, precision="32-true")

    def fit(
        self,
        model: L.LightningModule,
        loader: Iterable[Any],
        *,
        max_epochs: int = 1,
        max_steps: int = -1,
        seen: list[Any] | None = None,
    ) -> FitOutcome | None:
        """Train ``model`` (one that :func:`model_needs_trainer` passes) on ``loader`` for ``max_epochs`` epochs, or
        ``max_steps`` optimiser steps when > 0, as ``Trainer.fit`` would; each batch trained on is appended to
        ``seen`` when given.

        Returns:
            the outcome, or ``None`` when the module logged in a form only the ``Trainer`` reduces (see
            :class:`_Logged`): the caller trains the client again on the ``Trainer``.
        """
        logged = _Logged(steps_log_on_step=True)
        model.trainer = None  # no stale Trainer of an earlier fit answers self.trainer / self.current_epoch
        _, optimizer = self.fabric.setup(model, model.configure_optimizers(), move_to_device=False)
        model.log, model.log_dict = logged.log, logged.log_dict  # instance attributes shadow the methods
        model.train()
        torch.set_grad_enabled(True)
        steps = epochs = 0
        try:
            while (max_steps > 0 and steps < max_steps) or (max_steps <= 0 and epochs < max_epochs):
                logged.start_epoch()
                model.on_train_epoch_start()
                for batch_idx, batch in enumerate(loader):
                    logged.batch = batch
                    if seen is not None:
                        seen.append(batch)
                    optimizer.step(closure=_Closure(self.fabric, model, optimizer, batch, batch_idx))
                    logged.batch = None
                    steps += 1
                    if 0 < max_steps <= steps:
                        break
                model.on_train_epoch_end()
                logged.end_epoch()
                epochs += 1
        finally:
            del model.log, model.log_dict
            model.fabric = None  # the Trainer path and evaluation log through their own Trainer again
        if logged.unsupported:
            return None
        return FitOutcome(logged.metrics, steps, epochs, optimizer.optimizer)


class _Closure:
    """Lightning's automatic-optimisation closure: ``training_step``, then ``zero_grad``, then ``backward``."""

    def __init__(self, fabric: L.Fabric, model: L.LightningModule, optimizer: Any, batch: Any, batch_idx: int) -> None:
        self.fabric, self.model, self.optimizer, self.batch, self.batch_idx = fabric, model, optimizer, batch, batch_idx

    def __call__(self) -> torch.Tensor | None:
        output = self.model.training_step(self.batch, self.batch_idx)
        loss = output["loss"] if isinstance(output, Mapping) else output
        self.optimizer.zero_grad()
        if loss is not None:
            self.fabric.backward(loss)
        return loss


def lean_test(model: L.LightningModule, loader: Iterable[Any]) -> dict[str, float] | None:
    """``Trainer.test(model, loader)[0]`` without the ``Trainer``, for a model that overrides no test hook but
    ``test_step`` and the test epoch hooks (see :func:`model_needs_trainer`; the caller checks the options).

    As ``Trainer.test`` does: every module in eval mode under ``torch.inference_mode``, ``on_test_epoch_start``,
    ``test_step`` per batch, ``on_test_epoch_end``, logged values reduced as the ``Trainer`` would (see
    :class:`_Logged`), then each module's training mode restored.

    Returns:
        the logged metrics, or ``None`` when the model logged in a form only the ``Trainer`` reduces.
    """
    logged = _Logged(steps_log_on_step=False)
    modes = [(module, module.training) for module in model.modules()]
    model.trainer = None
    model.log, model.log_dict = logged.log, logged.log_dict
    model.eval()
    try:
        with torch.inference_mode():
            logged.start_epoch()
            model.on_test_epoch_start()
            for batch_idx, batch in enumerate(loader):
                logged.batch = batch
                model.test_step(batch, batch_idx)
                logged.batch = None
            model.on_test_epoch_end()
            logged.end_epoch()
    finally:
        del model.log, model.log_dict
        for module, training in modes:
            module.training = training
    if logged.unsupported:
        return None
    return {k: v for k, v in logged.metrics.items() if k not in logged.not_for_logger}
