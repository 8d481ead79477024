"""What a gradient-matching attack matches: the intercepted tensors of a :class:`ServerView` as a pseudo-gradient.

A gradient is matched as it is; an update of T local SGD steps at learning rate :math:`\\eta` is matched as the
pseudo-gradient :math:`-\\Delta W / \\eta`, against a simulation of the same steps (breaching's local-update user;
Geiping et al.'s ``FedAvgReconstructor``).
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_fl.messages import ServerView

__all__ = ["MatchingTarget", "leaked_batch_size", "matching_target"]


def leaked_batch_size(view: ServerView) -> int:
    """How many private images stand behind ``view``, from its public metadata.

    A gradient: ``batch_size``. An update of T local steps: ``batch_size * T`` capped at ``num_samples`` (T steps
    over n samples revisit them, as local epochs do). The aggregate: that times ``num_clients``.

    Raises:
        ValueError: when ``batch_size`` is missing from the metadata.
    """
    meta = view.metadata
    if not meta.get("batch_size"):
        raise ValueError(f"the {view.leak_point!r} view has no metadata['batch_size']; an attack needs it.")
    count = int(meta["batch_size"]) * int(meta.get("num_clients") or 1)
    if view.kind == "update":
        count *= int(meta.get("local_steps") or 1)
        if meta.get("num_samples"):
            count = min(count, int(meta["num_samples"]))
    return count


@dataclass(frozen=True)
class MatchingTarget:
    """What the attack matches, derived from a :class:`ServerView` (public information only).

    Args:
        names: matched parameter names, in model order.
        tensors: the target pseudo-gradient per name (the gradient, or ``-update / lr``), on the device of the
            matched parameters and in their dtype promoted to at least float32.
        local_steps: local SGD steps to simulate (1 for a gradient).
        lr: the client's learning rate (``None`` for a gradient).
        data_per_step: candidate images used per simulated step.
        num_images: candidate images to reconstruct.
        masks: per name, 1 where a coordinate is matched and 0 where it is not (an adaptive attack's known
            pruning mask); ``None`` matches every coordinate.
    """

    names: tuple[str, ...]
    tensors: tuple[Tensor, ...]
    local_steps: int
    lr: float | None
    data_per_step: int
    num_images: int
    masks: tuple[Tensor, ...] | None = None


def matching_target(view: ServerView, *, layers: Sequence[str] | None = None) -> MatchingTarget:
    """Turn the intercepted tensors into a pseudo-gradient target over the matched parameters.

    Args:
        view: what the server holds.
        layers: ``fnmatch`` patterns of parameter names to match (DPFL's partial-layer study); ``None``: all
            intercepted parameters.

    Raises:
        ValueError: when no parameter is left to match or an update lacks ``lr``/``local_steps``.
    """
    names = tuple(
        n
        for n, _ in view.model.named_parameters()
        if n in view.tensors and (layers is None or any(fnmatch.fnmatch(n, pattern) for pattern in layers))
    )
    if not names:
        raise ValueError(
            f"no parameter of {type(view.model).__name__} is both intercepted and selected by layers={layers}; "
            f"intercepted: {sorted(view.tensors)[:5]}..."
        )
    num_images = leaked_batch_size(view)
    reference = dict(view.model.named_parameters())[names[0]]
    device, dtype = reference.device, torch.promote_types(reference.dtype, torch.float32)
    if view.kind == "gradient":
        tensors = tuple(view.tensors[n].detach().to(device, dtype) for n in names)
        return MatchingTarget(names, tensors, 1, None, num_images, num_images)
    meta = view.metadata
    lr, steps = meta.get("lr"), int(meta.get("local_steps") or 0)
    if not lr or steps < 1:
        raise ValueError(
            f"attacking an update needs the client's metadata['lr'] and metadata['local_steps'], got lr={lr}, "
            f"local_steps={meta.get('local_steps')}."
        )
    optimizer = str(meta.get("optimizer", "sgd")).lower()
    if optimizer != "sgd":
        warnings.warn(
            f"the attacked update came from a {optimizer!r} optimiser but the attack simulates plain SGD steps; "
            "train the attacked clients with SGD (model.optimizer: sgd) or attack leak_point='local_gradient'.",
            stacklevel=3,
        )
    tensors = tuple(-view.tensors[n].detach().to(device, dtype) / lr for n in names)
    data_per_step = int(meta["batch_size"]) * int(meta.get("num_clients") or 1)
    return MatchingTarget(names, tensors, steps, float(lr), min(data_per_step, num_images), num_images)
