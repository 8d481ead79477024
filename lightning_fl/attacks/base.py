"""The attack interface: ``attack.reconstruct(view) -> Reconstruction``.

An attack receives only a :class:`~lightning_fl.messages.ServerView` (public state, intercepted tensors,
public metadata) and returns its guess of the private data. Ground truth never reaches it; scoring happens
afterwards in :mod:`lightning_fl.attacks.metrics`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor

from lightning_fl.messages import ServerView

__all__ = ["GradientAttack", "IterationCallback", "Reconstruction"]

IterationCallback = Callable[[int, float], None]
"""Called as ``callback(iteration, loss)`` after every optimisation step of an attack."""


@dataclass(frozen=True)
class Reconstruction:
    """An attack's output.

    Args:
        images: reconstructed images in [0, 1], shape ``(N, C, H, W)``.
        labels: recovered integer labels ``(N,)``, or ``None`` when the attack does not recover labels.
        loss_history: the attack objective after each iteration (of the best restart).
        info: anything else worth logging (restarts, chosen restart, time).
    """

    images: Tensor
    labels: Tensor | None
    loss_history: list[float] = field(default_factory=list)
    info: dict[str, float | int | str] = field(default_factory=dict)


class GradientAttack(ABC):
    """Base class of attacks: subclasses implement :meth:`reconstruct` and set ``name``."""

    name: str = "attack"

    @abstractmethod
    def reconstruct(self, view: ServerView, *, callback: IterationCallback | None = None) -> Reconstruction:
        """Reconstruct the private batch behind ``view``."""
