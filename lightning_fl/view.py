"""The read-only view of a federation that FL callbacks receive, as Lightning callbacks receive the Trainer.

It sits beside :mod:`lightning_fl.contexts`, outside :mod:`lightning_fl.federation`, so that callbacks and defences
import it without importing the loop's package; what it reads from the run (the records, the clients' states) it
receives as the small protocols below.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, overload

from torch import Tensor

from lightning_fl.contexts import ClientState, FederationSpec, RoundContext
from lightning_fl.privacy.accounting import PrivacyLedger
from lightning_fl.private import public_state

if TYPE_CHECKING:
    import lightning as L
    from lightning.pytorch.loggers import Logger

__all__ = [
    "ClientStates",
    "FederationView",
    "LedgerReading",
    "Registered",
    "RoundReport",
    "RunPlugins",
    "RunRecords",
    "StateStore",
]


class RunRecords(Protocol):
    """What a view reads and reports into of a run's records
    (:class:`~lightning_fl.federation.recording.RunRecorder`)."""

    loggers: Sequence[Logger]
    history: Sequence[dict[str, Any]]
    privacy: dict[str, dict[str, Any]]

    def record_attack(self, entry: dict[str, Any]) -> None: ...


class StateStore(Protocol):
    """The clients' own states and their one writer (:class:`~lightning_fl.federation.client_store.ClientStore`)."""

    def __getitem__(self, client_id: int) -> ClientState: ...

    def __len__(self) -> int: ...

    def set_extra(self, client_id: int, key: str, value: Any) -> None: ...


class RunPlugins(Protocol):
    """What a view reads of a run's plug-ins (:class:`~lightning_fl.federation.composition.Plugins`)."""

    callbacks: Sequence[Any]
    client_callbacks: Sequence[L.Callback]

    @property
    def components(self) -> Sequence[Any]: ...


@dataclass
class RoundReport:
    """What the plug-ins of one round report while it runs: metrics, clients whose state they changed, a stop.

    A round creates its own report and folds it into the :class:`~lightning_fl.federation.round.RoundResult` it
    returns; plug-ins write to it only through their context (``ctx.log_metrics``) or the round's
    :class:`FederationView` (``log_metrics``, ``set_client_extra``, ``request_stop``).

    Example:
        >>> report = RoundReport()
        >>> report.log_metrics({"epsilon": 1}); report.touch(3); report.touch(3); report.request_stop("budget")
        >>> report.metrics, report.touched, report.stop
        ({'epsilon': 1.0}, [3], 'budget')
    """

    metrics: dict[str, float] = field(default_factory=dict)
    touched: list[int] = field(default_factory=list)
    stop: str | None = None

    def log_metrics(self, metrics: dict[str, float]) -> None:
        """Add ``metrics`` to the round's history entry."""
        self.metrics.update({k: float(v) for k, v in metrics.items()})

    def touch(self, client_id: int) -> None:
        """Mark ``client_id``'s client-side state as changed in this round (committed with it)."""
        if client_id not in self.touched:
            self.touched.append(client_id)

    def request_stop(self, reason: str) -> None:
        """Stop after this round."""
        self.stop = reason


def _copy(state: ClientState) -> ClientState:
    return ClientState(
        state.client_id,
        {k: v.detach().clone() for k, v in state.private.items()},
        copy.deepcopy(state.extra),
        state.initialised,
    )


class ClientStates(Sequence[ClientState]):
    """The clients' own states, read-only: each item is a copy taken when it is read."""

    def __init__(self, states: StateStore | Sequence[ClientState]) -> None:
        self._states = states

    @overload
    def __getitem__(self, index: int) -> ClientState: ...

    @overload
    def __getitem__(self, index: slice) -> list[ClientState]: ...

    def __getitem__(self, index: int | slice) -> ClientState | list[ClientState]:
        if isinstance(index, slice):
            return [_copy(s) for s in self._states[index]]
        return _copy(self._states[index])

    def __len__(self) -> int:
        return len(self._states)


class Registered:
    """Which callbacks a run holds, without handing them out: membership by identity, their number and class names.

    Example:
        >>> first, second = object(), object()
        >>> held = Registered([first])
        >>> first in held, second in held, len(held), held.names
        (True, False, 1, ('object',))
    """

    def __init__(self, objects: Sequence[object]) -> None:
        self._ids = frozenset(id(o) for o in objects)  # identities only: no reference to the objects
        self.names = tuple(type(o).__name__ for o in objects)

    def __contains__(self, obj: object) -> bool:
        return id(obj) in self._ids

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        return f"Registered({list(self.names)})"


class LedgerReading:
    """What a callback may read of a privacy-spending part: its spent and projected epsilon, and its delta."""

    def __init__(self, ledger: PrivacyLedger) -> None:
        self._ledger = ledger

    @property
    def delta(self) -> float:
        return self._ledger.delta

    @property
    def name(self) -> str:
        """The class name of the part (for messages)."""
        return type(self._ledger).__name__

    def epsilon_spent(self) -> float:
        """See :meth:`~lightning_fl.privacy.accounting.PrivacyLedger.epsilon_spent`."""
        return self._ledger.epsilon_spent()

    def epsilon_projected(self, spec: FederationSpec) -> float:
        """See :meth:`~lightning_fl.privacy.accounting.PrivacyLedger.epsilon_projected`."""
        return self._ledger.epsilon_projected(spec)


class FederationView:
    """What a :class:`~lightning_fl.callbacks.FederatedCallback` may read of a federation, and how it reports.

    Reads return copies or read-only views: ``global_model`` and ``global_public_state`` are copies, ``clients``
    copies each client's state as it is read, ``history`` is a tuple, the callback lists answer membership and names
    only (:class:`Registered`), privacy-spending parts are reachable only through :meth:`ledgers`. A callback reports
    through :meth:`log_metrics`, :meth:`record_attack` and :meth:`request_stop`, and changes a client's own state in
    one way only: :meth:`set_client_extra` (a callback that models client-side work, such as a DP accountant).

    A view belongs to one round (:meth:`at` gives the view of another): what a callback reports goes into that
    round's :class:`RoundReport`.

    Args:
        spec: the run's shape (its ``num_rounds``: rounds T of the run).
        output_dir: the run directory.
        round_idx: the round (between rounds, the next one to run).
        report: where the round's reports go (``None``: outside a round, reports are not kept).
        global_model: the global model (read through copies).
        recorder: the run's history and loggers (reports go there).
        clients: the clients' own states (client-side storage).
        plugins: the run's plug-ins: its FL callbacks, the Lightning callbacks of each client's Trainer, and the
            privacy-spending parts among the callbacks and the stateful server-side parts (:meth:`ledgers`).
    """

    def __init__(
        self,
        spec: FederationSpec,
        output_dir: Path,
        *,
        round_idx: int = 0,
        report: RoundReport | None = None,
        global_model: L.LightningModule,
        recorder: RunRecords,
        clients: StateStore,
        plugins: RunPlugins,
    ) -> None:
        self._round_idx, self._report = round_idx, report if report is not None else RoundReport()
        self._spec, self._output_dir = spec, Path(output_dir)
        self._global_model, self._recorder, self._clients = global_model, recorder, clients
        self._callbacks, self._client_callbacks = Registered(plugins.callbacks), Registered(plugins.client_callbacks)
        ledgers = [*plugins.callbacks, *plugins.components]
        self._ledgers = tuple(LedgerReading(p) for p in ledgers if isinstance(p, PrivacyLedger))

    def at(self, round_idx: int, report: RoundReport | None = None) -> FederationView:
        """The view of round ``round_idx`` whose callbacks report into ``report``."""
        view = copy.copy(self)
        view._round_idx, view._report = round_idx, report if report is not None else RoundReport()
        return view

    @property
    def round_idx(self) -> int:
        return self._round_idx

    @property
    def num_rounds(self) -> int:
        return self._spec.num_rounds

    @property
    def spec(self) -> FederationSpec:
        return self._spec

    @property
    def output_dir(self) -> Path:
        return self._output_dir

    @property
    def global_model(self) -> L.LightningModule:
        """A copy of the global model (its architecture and public state)."""
        return copy.deepcopy(self._global_model)

    @property
    def loggers(self) -> tuple[Logger, ...]:
        return tuple(self._recorder.loggers)

    @property
    def history(self) -> tuple[dict[str, Any], ...]:
        return tuple(dict(h) for h in self._recorder.history)

    @property
    def clients(self) -> ClientStates:
        """The clients' own states, copied as read (only callbacks that model client-side work may use them)."""
        return ClientStates(self._clients)

    @property
    def callbacks(self) -> Registered:
        """Which FL callbacks the run holds (``callback in federation.callbacks``, their class names)."""
        return self._callbacks

    @property
    def client_callbacks(self) -> Registered:
        """Which Lightning callbacks each client's Trainer runs (``callback in federation.client_callbacks``)."""
        return self._client_callbacks

    def ledgers(self) -> tuple[LedgerReading, ...]:
        """What the privacy-spending parts of the run report (for a privacy budget)."""
        return self._ledgers

    def global_public_state(self) -> dict[str, Tensor]:
        """A copy of the public global state."""
        return {k: v.detach().clone() for k, v in public_state(self._global_model).items()}

    def round_context(self) -> RoundContext:
        """The :class:`~lightning_fl.contexts.RoundContext` of the current round."""
        return RoundContext(self._spec, self._round_idx, public_state(self._global_model), self._report.log_metrics)

    def set_client_extra(self, client_id: int, key: str, value: Any) -> None:
        """Store ``value`` under ``key`` in client ``client_id``'s own state (``ClientState.extra``).

        The one way a callback changes a client's state: for a callback that models client-side work (a DP
        accountant keeps its state per client). The value is stored as a copy and committed with the round.
        """
        self._clients.set_extra(client_id, key, value)
        self._report.touch(client_id)

    def log_metrics(self, metrics: dict[str, float]) -> None:
        """Add metrics to the current round's history entry, e.g. ``{"epsilon": 1.2}``."""
        self._report.log_metrics(metrics)

    def describe_privacy(self, component: str, facts: dict[str, Any]) -> None:
        """State how ``component`` accounts its privacy in ``summary.json["privacy"][component]`` (the sampling
        its accountant assumed and the one the run used), e.g. ``{"sampling": "poisson", "sample_rate": 0.1}``."""
        self._recorder.privacy[component] = dict(facts)

    def record_attack(self, entry: dict[str, Any]) -> None:
        """Append one attack result to ``summary.json["attacks"]``."""
        self._recorder.record_attack(entry)

    def request_stop(self, reason: str) -> None:
        """Stop after the current round."""
        self._report.request_stop(reason)
