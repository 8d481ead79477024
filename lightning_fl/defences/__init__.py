"""Defences: model-level layers (passports, key-lock), update transforms (noise, pruning, DP, Paillier)."""

from lightning_fl.defences.fedboosting import FedBoosting
from lightning_fl.defences.paillier import PackingSpec
from lightning_fl.defences.secure_aggregation import PaillierEncryption, SecureFedAvg

__all__: list[str] = ["FedBoosting", "PackingSpec", "PaillierEncryption", "SecureFedAvg"]
