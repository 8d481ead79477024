"""Defences: model-level layers (passports, key-lock), update transforms (noise, pruning, DP, Paillier)."""

from lightning_fl.defences.active_selection import ActiveSelector
from lightning_fl.defences.baselines import GaussianNoise, GradientPruning, add_gaussian_noise, prune_smallest
from lightning_fl.defences.classifier import DefendedClassifier, ModelDefence, load_defended
from lightning_fl.defences.dpfl_aggregation import DPFLAggregator
from lightning_fl.defences.dual_dp import DownlinkNoise, DualDP
from lightning_fl.defences.fedboosting import FedBoosting
from lightning_fl.defences.keylock import (
    KeyLock,
    KeyLockNorm,
    KeyLockNorm2d,
    KeyLocks,
    add_keylock,
    lock_parameter_share,
)
from lightning_fl.defences.paillier import PackingSpec
from lightning_fl.defences.passport import PassportConv2d, Passports, add_passports
from lightning_fl.defences.per_example_dp import ClientDPSGD, FedCDP, PerExampleDP
from lightning_fl.defences.pogz import PoGZNoise, allocate_budget, dpfl_noisy_update, pogz_laplace_noise, pogz_scores
from lightning_fl.defences.secure_aggregation import PaillierEncryption, SecureFedAvg
from lightning_fl.defences.server_dp import FedSDP, FedSDPServerNoise
from lightning_fl.defences.server_finetune import PublicFineTune
from lightning_fl.defences.split import PrivateFineTuning, PrivateSplit, split_private

__all__: list[str] = [
    "ActiveSelector",
    "ClientDPSGD",
    "DPFLAggregator",
    "DefendedClassifier",
    "DownlinkNoise",
    "DualDP",
    "FedBoosting",
    "FedCDP",
    "FedSDP",
    "FedSDPServerNoise",
    "GaussianNoise",
    "GradientPruning",
    "KeyLock",
    "KeyLockNorm",
    "KeyLockNorm2d",
    "KeyLocks",
    "ModelDefence",
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
    "dpfl_noisy_update",
    "load_defended",
    "lock_parameter_share",
    "pogz_laplace_noise",
    "pogz_scores",
    "prune_smallest",
    "split_private",
]
