"""Defences on the gradient a client computes: Soteria's pruning of the representation layer's gradient."""

from lightning_fl.defences.update.soteria import Soteria, representation_sensitivity, soteria_mask

__all__ = ["Soteria", "representation_sensitivity", "soteria_mask"]
