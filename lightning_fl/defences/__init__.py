"""Defences: bundles (:class:`Defence`) of model layers (passports, key-lock, private split), client training
callbacks (per-example DP) and update transforms (noise, pruning, client-level DP, PoGZ, Paillier)."""

from lightning_fl.defences.base import Defence, DefenceParts, apply_defences
from lightning_fl.defences.baselines import GaussianNoise, GradientPruning, add_gaussian_noise, prune_smallest
from lightning_fl.defences.dual_dp import DownlinkNoise, DualDP, DualDPFL
from lightning_fl.defences.keylock import KeyLock, KeyLockNorm2d, KeyLocks, add_keylock, lock_parameter_share
from lightning_fl.defences.paillier import PackingSpec
from lightning_fl.defences.passport import PassportConv2d, Passports, add_passports
from lightning_fl.defences.per_example_dp import ClientDPSGD, FedCDP, PerExampleDP
from lightning_fl.defences.pogz import PoGZNoise, allocate_budget, dpfl_noisy_update, pogz_laplace_noise, pogz_scores
from lightning_fl.defences.secure_aggregation import PaillierEncryption, SecureFedAvg
from lightning_fl.defences.server_dp import FedSDP, FedSDPServerNoise
from lightning_fl.defences.server_finetune import PublicFineTune
from lightning_fl.defences.split import PrivateFineTuning, PrivateSplit, split_private

__all__: list[str] = [
    "ClientDPSGD",
    "Defence",
    "DefenceParts",
    "DownlinkNoise",
    "DualDP",
    "DualDPFL",
    "FedCDP",
    "FedSDP",
    "FedSDPServerNoise",
    "GaussianNoise",
    "GradientPruning",
    "KeyLock",
    "KeyLockNorm2d",
    "KeyLocks",
    "PackingSpec",
    "PaillierEncryption",
    "PassportConv2d",
    "Passports",
    "PerExampleDP",
    "PoGZNoise",
    "PrivateFineTuning",
    "PrivateSplit",
    "PublicFineTune",
    "SecureFedAvg",
    "add_gaussian_noise",
    "add_keylock",
    "add_passports",
    "allocate_budget",
    "apply_defences",
    "dpfl_noisy_update",
    "lock_parameter_share",
    "pogz_laplace_noise",
    "pogz_scores",
    "prune_smallest",
    "split_private",
]
