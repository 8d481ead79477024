"""Data-level defences: the client trains on mixtures of its examples (MixUp, InstaHide), never on one image alone."""

from lightning_fl.defences.data.instahide import InstaHide, flip_signs
from lightning_fl.defences.data.mixing import MixingDefence, mix_examples
from lightning_fl.defences.data.mixup import MixUp

__all__ = ["InstaHide", "MixUp", "MixingDefence", "flip_signs", "mix_examples"]
