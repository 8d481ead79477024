"""Model-level defences: layers whose secrets stay on the client (passports, key-lock, private split), and
PRECODE's variational bottleneck."""

from lightning_fl.defences.model.keylock import (
    KeyLock,
    KeyLockNorm,
    KeyLockNorm2d,
    KeyLocks,
    add_keylock,
    lock_parameter_share,
)
from lightning_fl.defences.model.loading import load_defended
from lightning_fl.defences.model.passport import PassportConv2d, Passports, add_passports
from lightning_fl.defences.model.precode import PRECODE, VariationalBottleneck, add_precode, gaussian_kl
from lightning_fl.defences.model.split import PrivateFineTuning, PrivateSplit, split_private

__all__ = [
    "PRECODE",
    "KeyLock",
    "KeyLockNorm",
    "KeyLockNorm2d",
    "KeyLocks",
    "PassportConv2d",
    "Passports",
    "PrivateFineTuning",
    "PrivateSplit",
    "VariationalBottleneck",
    "add_keylock",
    "add_passports",
    "add_precode",
    "gaussian_kl",
    "load_defended",
    "lock_parameter_share",
    "split_private",
]
