"""Norm clipping of one tensor, of a whole state dict, or of each tensor of a state dict (per layer)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["clip_per_tensor", "clip_state", "clip_update", "state_norm"]


def _check_max_norm(max_norm: float) -> None:
    if not max_norm > 0:
        raise ValueError(f"`max_norm` must be > 0, got {max_norm}; it is the clip bound (alpha in DPFL, C in Fed-CDP).")


def clip_update(update: Tensor, *, max_norm: float, p: float = 2.0) -> Tensor:
    r"""Scale ``update`` so that its ``p``-norm is at most ``max_norm``.

    Implements Eq. (2) of DPFL (Zhu et al., IEEE IoT-J 2021) with ``p=1``:
    :math:`\bar g = g / \max(1, \|g\|_1 / \alpha)`. Fed-CDP uses ``p=2``, per layer.

    Args:
        update: model delta :math:`g = w^{(t)} - w`, any shape.
        max_norm: clip bound :math:`\alpha`; must be > 0.
        p: norm order.

    Raises:
        ValueError: if ``max_norm`` is not positive.

    Example:
        >>> clip_update(torch.tensor([3.0, 4.0]), max_norm=1.0)
        tensor([0.6000, 0.8000])
    """
    _check_max_norm(max_norm)
    return update / torch.clamp(update.norm(p=p) / max_norm, min=1.0)


def state_norm(state: dict[str, Tensor], *, p: float = 2.0) -> Tensor:
    """The ``p``-norm of all tensors of ``state`` flattened together.

    Example:
        >>> state_norm({"a": torch.tensor([3.0]), "b": torch.tensor([-4.0])}, p=1.0)
        tensor(7.)
    """
    return torch.linalg.vector_norm(torch.cat([v.reshape(-1).float() for v in state.values()]), ord=p)


def clip_state(state: dict[str, Tensor], *, max_norm: float, p: float = 2.0) -> dict[str, Tensor]:
    r"""Clip a whole state dict (a model update) jointly: :math:`g / \max(1, \|g\|_p / \alpha)`.

    DPFL's Eq. (2) clips the whole-model update in L1.

    Raises:
        ValueError: if ``max_norm`` is not positive.

    Example:
        >>> clip_state({"a": torch.tensor([3.0]), "b": torch.tensor([-4.0])}, max_norm=1.0, p=1.0)
        {'a': tensor([0.4286]), 'b': tensor([-0.5714])}
    """
    _check_max_norm(max_norm)
    factor = torch.clamp(state_norm(state, p=p) / max_norm, min=1.0)
    return {k: v / factor.to(v.dtype) for k, v in state.items()}


def clip_per_tensor(state: dict[str, Tensor], *, max_norm: float, p: float = 2.0) -> dict[str, Tensor]:
    r"""Clip each tensor of ``state`` to ``max_norm`` on its own (per-layer clipping).

    Implements line 10 of Alg. 1 (Fed-SDP) of Wei et al. (ICDCS 2021):
    :math:`\Delta\bar W_m = \Delta W_m / \max(1, \|\Delta W_m\|_2 / C)` for every layer m.

    Raises:
        ValueError: if ``max_norm`` is not positive.

    Example:
        >>> clip_per_tensor({"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([0.5])}, max_norm=1.0)
        {'a': tensor([0.6000, 0.8000]), 'b': tensor([0.5000])}
    """
    return {k: clip_update(v, max_norm=max_norm, p=p) for k, v in state.items()}
