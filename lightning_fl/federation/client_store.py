"""The client store: every client's own state and the initial private state, with one writer.

Private state is client-side storage (DESIGN.md, "One owner of client state"): the store holds each client's
:class:`~lightning_fl.contexts.ClientState` and the private layers every client starts from, and it is the only
object of the federation that writes them. A local fit returns what it produced (:class:`ClientFit`); the client
step keeps it here; checkpoints, worker processes, Flower's ClientApps and evaluation read and restore through the
store.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from torch import Tensor

from lightning_fl.contexts import ClientState
from lightning_fl.messages import ClientUpdate, GroundTruth

__all__ = ["ClientFit", "ClientStore"]


@dataclass(frozen=True)
class ClientFit:
    """What one local fit produced.

    Args:
        update: the raw update (before the client transforms).
        private: the client's private tensors after the fit (``None``: kept on the client's own node, as Flower's
            ClientApps keep them).
        trained_on: the examples the fit drew when it trained by local steps and a callback listens at the
            client-update or aggregate leak point; ``None`` otherwise (the client's whole training set is then the
            ground truth).
    """

    update: ClientUpdate
    private: dict[str, Tensor] | None = None
    trained_on: GroundTruth | None = None


class ClientStore(Sequence[ClientState]):
    """Every client's :class:`~lightning_fl.contexts.ClientState` and the initial private state.

    Items are the clients' live states, for the client side of the boundary (a client's own context); server-side
    readers get copies (:class:`~lightning_fl.view.ClientStates`).

    Args:
        num_clients: clients in the federation.
        initial_private: the private tensors every client's model starts from before it draws its own.

    Example:
        >>> import torch
        >>> store = ClientStore(2, {"key": torch.zeros(1)})
        >>> store.keep_fit(1, {"key": torch.ones(1)})
        >>> store[1].initialised, store[0].initialised, list(store.state_dicts([0, 1]))
        (True, False, [1])
    """

    def __init__(self, num_clients: int, initial_private: Mapping[str, Tensor]) -> None:
        self._states = [ClientState(k) for k in range(num_clients)]
        self._initial_private = {k: v.detach().clone() for k, v in initial_private.items()}

    @overload
    def __getitem__(self, index: int) -> ClientState: ...

    @overload
    def __getitem__(self, index: slice) -> list[ClientState]: ...

    def __getitem__(self, index: int | slice) -> ClientState | list[ClientState]:
        return self._states[index]

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[ClientState]:
        return iter(self._states)

    @property
    def initial_private(self) -> dict[str, Tensor]:
        """The private tensors every client starts from (the global model's own private layers)."""
        return self._initial_private

    def emptied(self) -> ClientStore:
        """A store of the same clients holding no client's state (what another process may receive)."""
        return ClientStore(len(self), self._initial_private)

    def keep_fit(self, client_id: int, private: Mapping[str, Tensor]) -> None:
        """Keep the private tensors of client ``client_id``'s successful fit (the store owns them from now on); it
        holds its own secrets from now on."""
        state = self._states[client_id]  # the same object its context holds
        state.private = dict(private)
        state.initialised = bool(state.private)

    def set_extra(self, client_id: int, key: str, value: Any) -> None:
        """Store a copy of ``value`` under ``key`` in client ``client_id``'s ``extra`` state."""
        self._states[client_id].extra[key] = copy.deepcopy(value)

    def restore(self, state: ClientState) -> None:
        """Put ``state`` back as its client's state (from a checkpoint, a worker's job, a Flower node)."""
        self._states[state.client_id] = state

    def forget(self, client_id: int) -> None:
        """Drop client ``client_id``'s state (a process that keeps no client's secrets between fits)."""
        self._states[client_id] = ClientState(client_id)

    def restore_initial_private(self, private: Mapping[str, Tensor]) -> None:
        """Put back the committed initial private tensors."""
        self._initial_private = dict(private)

    def state_dicts(self, client_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        """Client-side storage of the clients in ``client_ids`` that hold anything."""
        states = self._states
        return {k: states[k].state_dict() for k in client_ids if states[k].initialised or states[k].extra}
