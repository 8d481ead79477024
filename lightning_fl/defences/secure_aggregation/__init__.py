"""Secure aggregation with Paillier: the packed fixed-point crypto core and the client/server protocol."""

from lightning_fl.defences.secure_aggregation.paillier import PackingSpec
from lightning_fl.defences.secure_aggregation.protocol import PaillierEncryption, SecureFedAvg

__all__ = ["PackingSpec", "PaillierEncryption", "SecureFedAvg"]
