"""Loop-level callbacks (the hook base class, attacks at leak points, privacy budget) and FedProx's client callback."""

from lightning_fl.callbacks.base import FederatedCallback
from lightning_fl.callbacks.fedprox import FedProx
from lightning_fl.callbacks.gradient_leakage import GradientLeakage
from lightning_fl.callbacks.privacy_budget import PrivacyBudget

__all__ = ["FedProx", "FederatedCallback", "GradientLeakage", "PrivacyBudget"]
