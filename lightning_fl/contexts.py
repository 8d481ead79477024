"""Narrow contexts: what a plug-in (aggregator, transform, selector, accountant) may know about the run.

Flower hands a strategy ``server_round`` and the results, not the server; Lightning hands a callback the
``Trainer``. Here a plug-in receives one of these frozen objects instead of the loop:

* :class:`FederationSpec`: the shape of the run, fixed at loop construction (clients, rounds, local work, seed).
* :class:`RoundContext`: one round: its index, seeded random streams ``rng(purpose)``, a copy of the public
  global state, and a way to report metrics to the round's history.
* :class:`ClientContext`: one client inside a round: its id, its local model (public state received plus its own
  private layers), its own typed state (:class:`ClientState`) and its validation data. It exists only on the
  client side of the boundary, so nothing server-side can reach a client's secrets through it.
* :class:`SetupContext`: what a server-side part may inspect once before the first round (no client state);
  :class:`ClientSetupContext`: the clients' own states, for the client-side set-up of a client transform (keys).

This module sits outside :mod:`lightning_fl.federation` so that plug-ins and the privacy maths import these types
without importing the loop's package.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from torch.utils.data import Dataset

__all__ = [
    "ClientContext",
    "ClientEvaluationStep",
    "ClientSetupContext",
    "ClientState",
    "FederationSpec",
    "RoundContext",
    "SetupContext",
    "StateSnapshot",
    "derive_seed",
]


def derive_seed(seed: int, *parts: object) -> int:
    """A 31-bit seed derived from ``seed`` and a path of parts (round, client, purpose).

    Example:
        >>> derive_seed(0, "round", 3) == derive_seed(0, "round", 3) != derive_seed(0, "round", 4)
        True
    """
    digest = hashlib.sha256("/".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


@dataclass(frozen=True)
class FederationSpec:
    """The shape of a federated run, fixed when the loop is built.

    Args:
        num_clients: clients in the federation (K).
        clients_per_round: clients selected per round (K_t).
        num_rounds: communication rounds T.
        local_epochs: local epochs E per client fit (``None`` when ``local_steps`` is set).
        local_steps: local optimiser steps per client fit, or ``None`` for epochs.
        seed: master seed; every random stream derives from it with :func:`derive_seed`.
        batch_size: local mini-batch size B.
        num_train_samples: local training samples n_k of each client.
        update_keys: the public floating-point state keys an update carries (fixed for a run).
        num_classes: classes of the task, for attacks' label inference (``None`` when unknown).
        input_shape: shape of one input, for attacks (``None`` when unknown).

    Example:
        >>> spec = FederationSpec(num_clients=2, clients_per_round=1, num_rounds=3, local_epochs=1, local_steps=None,
        ...                       seed=0, batch_size=8, num_train_samples=(20, 12))
        >>> spec.steps_per_round(0), spec.sample_rate(1)
        (3, 0.6666666666666666)
    """

    num_clients: int
    clients_per_round: int
    num_rounds: int
    local_epochs: int | None
    local_steps: int | None
    seed: int
    batch_size: int
    num_train_samples: tuple[int, ...]
    update_keys: tuple[str, ...] = ()
    num_classes: int | None = None
    input_shape: tuple[int, ...] | None = None

    @classmethod
    def build(
        cls,
        model: nn.Module,
        datamodule: Any,
        *,
        clients_per_round: int | float,
        num_rounds: int,
        local_epochs: int,
        local_steps: int | None,
        seed: int,
        min_clients: int = 1,
    ) -> FederationSpec:
        """The spec of a run of ``model`` on ``datamodule`` (set up), validating the loop's settings (:meth:`check`).

        Raises:
            ValueError: naming the setting and the fix.
        """
        from lightning_fl.private import public_state

        num_clients = datamodule.num_clients
        per_round = cls.check(
            num_clients,
            clients_per_round=clients_per_round,
            num_rounds=num_rounds,
            local_epochs=local_epochs,
            local_steps=local_steps,
            min_clients=min_clients,
        )
        return cls(
            num_clients=num_clients,
            clients_per_round=per_round,
            num_rounds=num_rounds,
            local_epochs=None if local_steps else local_epochs,
            local_steps=local_steps,
            seed=seed,
            batch_size=datamodule.batch_size,
            num_train_samples=tuple(datamodule.num_train_samples(k) for k in range(num_clients)),
            update_keys=tuple(k for k, v in public_state(model).items() if v.is_floating_point()),
            num_classes=datamodule.num_classes,
            input_shape=tuple(datamodule.input_shape),
        )

    @staticmethod
    def check(
        num_clients: int,
        *,
        clients_per_round: int | float,
        num_rounds: int,
        local_epochs: int,
        local_steps: int | None,
        min_clients: int = 1,
    ) -> int:
        """Validate the loop's settings for ``num_clients`` clients; returns the clients per round.

        Raises:
            ValueError: naming the setting and the fix.

        Example:
            >>> FederationSpec.check(10, clients_per_round=0.5, num_rounds=3, local_epochs=1, local_steps=None)
            5
        """
        if num_rounds < 0:
            raise ValueError(f"loop.num_rounds={num_rounds} must be >= 0.")
        if local_steps is None and local_epochs < 1:
            raise ValueError(f"loop.local_epochs={local_epochs} must be >= 1 (or set loop.local_steps).")
        if local_steps is not None and local_steps < 1:
            raise ValueError(f"loop.local_steps={local_steps} must be >= 1 or null.")
        per_round = _resolve_clients_per_round(clients_per_round, num_clients)
        if not 1 <= min_clients <= per_round:
            raise ValueError(
                f"loop.min_clients={min_clients} must be between 1 and loop.clients_per_round ({per_round})."
            )
        return per_round

    def steps_per_round(self, client_id: int) -> int:
        """Local optimiser steps of client ``client_id`` in one round."""
        if self.local_steps:
            return self.local_steps
        n = self.num_train_samples[client_id]
        return (self.local_epochs or 1) * math.ceil(n / min(self.batch_size, n))

    def sample_rate(self, client_id: int) -> float:
        """The Poisson-equivalent sampling rate :math:`q_k = B / n_k` of one local step of ``client_id``."""
        n = self.num_train_samples[client_id]
        return min(self.batch_size, n) / n


def _resolve_clients_per_round(value: int | float, num_clients: int) -> int:
    if isinstance(value, float) and (not value.is_integer() or value <= 1.0):
        if not 0.0 < value <= 1.0:
            raise ValueError(f"loop.clients_per_round={value} as a fraction must be in (0, 1].")
        return max(1, round(value * num_clients))
    k = int(value)
    if k < 1:
        raise ValueError(f"loop.clients_per_round={value} must be >= 1.")
    if k > num_clients:
        raise ValueError(
            f"loop.clients_per_round={k} exceeds data.num_clients={num_clients}; lower the first or raise the second."
        )
    return k


@dataclass
class ClientState:
    """One participant's own state: its private tensors and what its components keep across rounds.

    Args:
        client_id: index in the federated data module.
        private: private tensors (passports, keys, lock layers, private layers), keyed like the model's state
            dict; empty until the client's first fit succeeded, or for a model without any.
        extra: other client-side state that persists across rounds, one key per component (a local accountant,
            PoGZ scores, a Paillier key).
        initialised: whether ``private`` holds this client's own secrets (set only after a successful fit).
    """

    client_id: int
    private: dict[str, Tensor] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    initialised: bool = False

    def state_dict(self) -> dict[str, Any]:
        """What the client stores on its side (never part of the server checkpoint)."""
        return {
            "client_id": self.client_id,
            "private": self.private,
            "extra": self.extra,
            "initialised": self.initialised,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ClientState:
        """Rebuild what :meth:`state_dict` returned."""
        return cls(state["client_id"], state["private"], state.get("extra", {}), state["initialised"])


class StateSnapshot(Mapping[str, Tensor]):
    """A read-only mapping of detached tensor copies, taken once; every read hands out a new copy.

    The copy taken at construction never leaves the snapshot, so contexts may share one snapshot
    (``StateSnapshot.of`` reuses it) and a plug-in that writes in place into what it read changes only its own copy:
    no other plug-in, client or aggregator sees the write.

    Example:
        >>> live = {"w": torch.zeros(2)}
        >>> snap = StateSnapshot.of(live)
        >>> _ = snap["w"].add_(1.0)
        >>> live["w"], snap["w"], StateSnapshot.of(snap) is snap
        (tensor([0., 0.]), tensor([0., 0.]), True)
    """

    __slots__ = ("_state",)

    def __init__(self, state: Mapping[str, Tensor]) -> None:
        self._state = {k: v.detach().clone() for k, v in state.items()}

    @classmethod
    def of(cls, state: Mapping[str, Tensor]) -> StateSnapshot:
        """``state`` itself when it is a snapshot already, else a snapshot of it."""
        return state if isinstance(state, StateSnapshot) else cls(state)

    def __getitem__(self, key: str) -> Tensor:
        return self._state[key].clone()

    def shapes(self) -> dict[str, torch.Size]:
        """Every tensor's shape, without copying any tensor."""
        return {k: v.shape for k, v in self._state.items()}

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    def __repr__(self) -> str:
        return f"StateSnapshot({list(self._state)})"


@dataclass(frozen=True)
class RoundContext:
    """One round as a plug-in sees it: run shape, round index, seeded randomness, a copy of the global state.

    Args:
        spec: the run's shape.
        round_idx: 0-based round.
        global_state: the public global state at the start of the round. The context holds a
            :class:`StateSnapshot` of it, whose every read is a new copy, so a plug-in that writes into these tensors
            changes only its own copy, never the global model, another plug-in's view or a client's; the loop changes
            the model only through the value the aggregator and the server transforms return.
        metrics_sink: where :meth:`log_metrics` sends metrics (the round's history entry and the loggers).
    """

    spec: FederationSpec
    round_idx: int
    global_state: Mapping[str, Tensor] = field(default_factory=dict)
    metrics_sink: Callable[[dict[str, float]], None] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "global_state", StateSnapshot.of(self.global_state))

    def seed(self, *purpose: object) -> int:
        """A seed for something random in this round, e.g. ``ctx.seed("noise", client_id)``."""
        return derive_seed(self.spec.seed, self.round_idx, *purpose)

    def rng(self, *purpose: object) -> torch.Generator:
        """A CPU generator seeded for ``purpose`` in this round; the same purpose gives the same stream on resume."""
        return torch.Generator().manual_seed(self.seed(*purpose))

    def log_metrics(self, metrics: dict[str, float]) -> None:
        """Add metrics to this round's history entry, e.g. ``{"epsilon": 1.2}``."""
        if self.metrics_sink is not None:
            self.metrics_sink({k: float(v) for k, v in metrics.items()})


@dataclass(frozen=True)
class ClientContext(RoundContext):
    """One client inside a round, on the client's side of the boundary.

    Args:
        client_id: the client.
        model: the client's local model (the state it received plus its own private layers); after the fit it
            holds the trained weights.
        state: the client's own :class:`ClientState`.
        val_dataloader: builds the client's validation loader (``None`` without validation data).
    """

    client_id: int = -1
    model: nn.Module | None = field(default=None, repr=False, compare=False)
    state: ClientState | None = field(default=None, repr=False, compare=False)
    val_dataloader: Callable[[], Iterable[Any]] | None = field(default=None, repr=False, compare=False)


class ClientEvaluationStep(Protocol):
    """The declared evaluation step on the clients' side (see
    :class:`~lightning_fl.federation.evaluation.ClientEvaluation`): clients decode a shared model through their
    client transforms' ``decode_aggregate``, add it to ``ctx.global_state``, evaluate it on their own data (``split``,
    ``metric`` and the other options) and return only the losses."""

    def losses(self, message: Any, *, ctx: RoundContext, client_ids: Sequence[int], **options: Any) -> list[float]: ...


@dataclass(frozen=True)
class SetupContext:
    """What a server-side part may inspect once, before the first round (``setup(ctx)``): what the server holds,
    never a client's state or data (a plug-in that needs the clients' data asks on their side, in
    ``setup_clients(ctx: ClientSetupContext)``).

    Args:
        spec: the run's shape and public metadata (clients' sample counts, ``num_classes``, ``input_shape``).
        test_set: the server's own held-out data, on which it evaluates the global model (``None`` when the run
            has none); public-data defences draw from it.
        global_model: a copy of the global model (its architecture and public state; private layers hold the
            server's own initialisation, never a client's).
        trainer_options: options of the inner Trainers, for components that train or evaluate a model.
        aggregator: the aggregation rule, for transforms that must match it (Paillier needs a ciphertext-aware
            one; check its class with ``isinstance``).
        server_transforms: the server-side chain, for transforms that warn about combinations.
        client_evaluation: the declared evaluation step on the clients' side, for rules that need the clients'
            losses (FedBoosting).
    """

    spec: FederationSpec
    test_set: Dataset | None = field(repr=False)
    global_model: nn.Module = field(repr=False)
    trainer_options: dict[str, Any] = field(default_factory=dict, repr=False)
    aggregator: object = field(default=None, repr=False)
    server_transforms: tuple[object, ...] = field(default=(), repr=False)
    client_evaluation: ClientEvaluationStep | None = field(default=None, repr=False)


@dataclass(frozen=True)
class ClientSetupContext:
    """What a plug-in's client-side set-up (``setup_clients(ctx)``) receives, once before the first round.

    It runs on the clients' side of the boundary: a key ceremony (Paillier's key holder shares a key pair),
    restoring what a transform keeps per client (PoGZ's upload counts), or a check or a contribution that needs the
    clients' own data (FedBoosting needs a validation split on every client; a public fine-tuning set drawn from
    validation splits is the clients' gift to the server).

    Args:
        spec: the run's shape.
        clients: every client's own :class:`ClientState` (client-side storage).
        val_sets: every client's own validation split (empty where the clients run elsewhere, as under Flower).
    """

    spec: FederationSpec
    clients: tuple[ClientState, ...] = field(repr=False)
    val_sets: tuple[Dataset, ...] = field(default=(), repr=False)
