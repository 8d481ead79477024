"""Defences: bundles (:class:`Defence`) of model layers (passports, key-lock, private split, PRECODE), client
training callbacks (per-example DP, Soteria, MixUp, InstaHide) and update transforms (noise, pruning, client-level
DP, PoGZ, Paillier)."""

from lightning_fl.defences.base import Defence, DefenceParts, apply_defences, apply_layers, check_defences_once
from lightning_fl.defences.data import *  # noqa: F403
from lightning_fl.defences.data import __all__ as _data
from lightning_fl.defences.dp import *  # noqa: F403
from lightning_fl.defences.dp import __all__ as _dp
from lightning_fl.defences.model import *  # noqa: F403
from lightning_fl.defences.model import __all__ as _model
from lightning_fl.defences.secure_aggregation import *  # noqa: F403
from lightning_fl.defences.secure_aggregation import __all__ as _secure_aggregation
from lightning_fl.defences.update import *  # noqa: F403
from lightning_fl.defences.update import __all__ as _update

__all__: list[str] = [
    "Defence",
    "DefenceParts",
    "apply_defences",
    "apply_layers",
    "check_defences_once",
    *_data,
    *_dp,
    *_model,
    *_secure_aggregation,
    *_update,
]
