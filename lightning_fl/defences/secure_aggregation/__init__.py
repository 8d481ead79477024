"""Secure aggregation: Paillier (the packed fixed-point crypto core and its protocol) and pairwise masking (SecAgg)."""

from lightning_fl.defences.secure_aggregation.paillier import PackingSpec
from lightning_fl.defences.secure_aggregation.protocol import PaillierEncryption, SecureFedAvg
from lightning_fl.defences.secure_aggregation.secagg import SecAggMasking, SecAggSum

__all__ = ["PackingSpec", "PaillierEncryption", "SecAggMasking", "SecAggSum", "SecureFedAvg"]
