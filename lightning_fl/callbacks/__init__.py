"""Loop-level callbacks: the hook base class, attacks at leak points, privacy budget."""

from lightning_fl.callbacks.base import FederatedCallback

__all__ = ["FederatedCallback"]
