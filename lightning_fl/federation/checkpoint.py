"""Checkpoints of a federated run: the server's public state, and each client's own state, kept apart.

The server checkpoint holds only what the server may store (public global state, component states,
history); each client's private tensors and per-client state go to client-side storage. Files are written
to a temporary name and renamed, so a crash never leaves half a file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_fl.federation.contexts import ClientState
from lightning_fl.private import load_state_into

__all__ = ["Checkpoint"]


def _atomic_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


class Checkpoint:
    """Where one run keeps its server and client checkpoints.

    Args:
        output_dir: the run directory; ``checkpoints/server.pt`` and ``clients/client_<k>.pt`` below it.
        enabled: whether the loop writes one after every round (reading a checkpoint works either way).
    """

    def __init__(self, output_dir: str | Path, *, enabled: bool = True) -> None:
        self.output_dir, self.enabled = Path(output_dir), enabled

    def save_run(self, loop: Any, touched: Iterable[int]) -> None:
        """Write ``loop``'s server state and the client-side state of the clients in ``touched``."""
        server = {
            "round_idx": loop.round_idx,
            "global_state": {k: v.detach().cpu() for k, v in loop.global_public_state().items()},
            "components": [c.state_dict() for c in loop.components()],
            "callbacks": [cb.state_dict() for cb in loop.callbacks],
            **loop.recorder.state_dict(),
        }
        self.save(server, clients=loop.runner.state_dicts(touched), initial_private=loop.runner.initial_private)

    def restore_run(self, loop: Any) -> bool:
        """Restore ``loop`` to its last completed round; False when there is no checkpoint."""
        state = self.load_server()
        if state is None:
            return False
        load_state_into(loop.global_model, state["global_state"])
        loop.round_idx = int(state["round_idx"])
        for component, c_state in zip(loop.components(), state["components"], strict=True):
            component.load_state_dict(c_state)
        for cb, cb_state in zip(loop.callbacks, state["callbacks"], strict=True):
            cb.load_state_dict(cb_state)
        loop.recorder.load_state_dict(state)
        loop.runner.initial_private = self.load_initial_private() or loop.runner.initial_private
        for k, c_state in self.load_clients(range(loop.num_clients)).items():
            loop.runner.states[k] = ClientState.from_state_dict(c_state)
        return True

    @property
    def server_path(self) -> Path:
        """The server checkpoint (public state only)."""
        return self.output_dir / "checkpoints" / "server.pt"

    @property
    def initial_private_path(self) -> Path:
        """What new clients start their private state from (client-side storage)."""
        return self.output_dir / "clients" / "initial_private.pt"

    def client_path(self, client_id: int) -> Path:
        """Client-side storage (private tensors); never part of the server checkpoint."""
        return self.output_dir / "clients" / f"client_{client_id}.pt"

    def save(
        self,
        server: dict[str, Any],
        *,
        clients: Mapping[int, dict[str, Any]],
        initial_private: dict[str, Tensor],
    ) -> None:
        """Write the server state, the state of the given clients, and (once) the initial private state."""
        _atomic_save(server, self.server_path)
        if initial_private and not self.initial_private_path.exists():
            _atomic_save(initial_private, self.initial_private_path)
        for client_id, state in clients.items():
            _atomic_save(state, self.client_path(client_id))

    def load_server(self) -> dict[str, Any] | None:
        """The server state of the last completed round, or ``None`` when there is none."""
        if not self.server_path.exists():
            return None
        return torch.load(self.server_path, map_location="cpu", weights_only=True)

    def load_initial_private(self) -> dict[str, Tensor] | None:
        """The stored initial private state, or ``None``."""
        path = self.initial_private_path
        return torch.load(path, map_location="cpu", weights_only=True) if path.exists() else None

    def load_clients(self, client_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        """The stored state of each client in ``client_ids`` that has one."""
        return {
            k: torch.load(self.client_path(k), map_location="cpu", weights_only=True)
            for k in client_ids
            if self.client_path(k).exists()
        }
