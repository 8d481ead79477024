"""Client: a federated participant's private state and its local Lightning training run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from torch import Tensor

from lightning_fl.private import private_state, reset_private_state

__all__ = ["Client", "load_state_into"]


def load_state_into(model: torch.nn.Module, state: dict[str, Tensor]) -> None:
    """Copy ``state`` into the matching entries of ``model``'s state in place (keys not given are kept)."""
    own = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for key, value in state.items():
            own[key].copy_(value)


@dataclass
class Client:
    """One participant: its id and the private tensors that never leave it.

    Args:
        client_id: index in the federated data module.
        private: the client's private tensors (passports, keys, lock layers, private layers), keyed like
            the model's state dict; empty until the client first trains, or for a model without any.
        extra: other client-side state that must persist across rounds (e.g. a local accountant).
    """

    client_id: int
    private: dict[str, Tensor] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    initialised: bool = False

    def prepare(
        self,
        worker: L.LightningModule,
        public: dict[str, Tensor],
        *,
        generator_seed: int,
        initial_private: dict[str, Tensor],
    ) -> None:
        """Load the received public state and this client's private state into the shared worker model.

        On first use, the client starts from the model's initial private tensors and lets every private
        module draw its own secrets (``reset_private``) from ``generator_seed``.
        """
        load_state_into(worker, public)
        if not initial_private:
            return
        if not self.initialised:
            load_state_into(worker, initial_private)
            reset_private_state(worker, generator=torch.Generator().manual_seed(generator_seed))
            self.initialised = True
        else:
            load_state_into(worker, self.private)

    def keep_private(self, worker: L.LightningModule) -> None:
        """Store the worker's private tensors after training (copies, so the worker can be reused)."""
        self.private = {k: v.detach().clone() for k, v in private_state(worker).items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "private": self.private,
            "extra": self.extra,
            "initialised": self.initialised,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Client:
        return cls(state["client_id"], state["private"], state.get("extra", {}), state["initialised"])
