"""Gradient-leakage and model-inversion attacks; each runs standalone: ``attack.reconstruct(view)``."""

from lightning_fl.attacks.base import GradientAttack, IterationCallback, Reconstruction

__all__ = ["GradientAttack", "IterationCallback", "Reconstruction"]
