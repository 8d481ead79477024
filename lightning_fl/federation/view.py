"""The read-only view of the loop that FL callbacks receive, as Lightning callbacks receive the Trainer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor

if TYPE_CHECKING:
    import lightning as L
    from lightning.pytorch.loggers import Logger

    from lightning_fl.federation.contexts import ClientState, FederationSpec, RoundContext

__all__ = ["FederationView"]


class FederationView:
    """What a :class:`~lightning_fl.callbacks.FederatedCallback` may read of the loop, and how it reports.

    Reads return copies or tuples, so a callback cannot rewire the run (add a Trainer callback, swap the
    aggregator); it reports through :meth:`log_metrics`, :meth:`record_attack` and :meth:`request_stop`.
    ``clients`` are the clients' own states: only callbacks that model client-side work (a DP accountant)
    may use them.
    """

    def __init__(self, loop: Any) -> None:
        self._loop = loop

    @property
    def round_idx(self) -> int:
        return self._loop.round_idx

    @property
    def num_rounds(self) -> int:
        return self._loop.num_rounds

    @property
    def spec(self) -> FederationSpec:
        return self._loop.spec

    @property
    def output_dir(self) -> Path:
        return self._loop.output_dir

    @property
    def global_model(self) -> L.LightningModule:
        """The global model (its architecture and public state; never write to it)."""
        return self._loop.global_model

    @property
    def loggers(self) -> tuple[Logger, ...]:
        return tuple(self._loop.recorder.loggers)

    @property
    def history(self) -> tuple[dict[str, Any], ...]:
        return tuple(self._loop.history)

    @property
    def clients(self) -> tuple[ClientState, ...]:
        return tuple(self._loop.clients)

    @property
    def callbacks(self) -> tuple[Any, ...]:
        return tuple(self._loop.callbacks)

    @property
    def client_callbacks(self) -> tuple[L.Callback, ...]:
        return tuple(self._loop.client_callbacks)

    @property
    def components(self) -> tuple[Any, ...]:
        """Selector, aggregator and every transform, in checkpoint order."""
        return tuple(self._loop.components())

    def global_public_state(self) -> dict[str, Tensor]:
        """A copy of the public global state."""
        return {k: v.detach().clone() for k, v in self._loop.global_public_state().items()}

    def round_context(self) -> RoundContext:
        """The :class:`~lightning_fl.federation.RoundContext` of the current round."""
        return self._loop.round_context()

    def log_metrics(self, metrics: dict[str, float]) -> None:
        """Add metrics to the current round's history entry, e.g. ``{"epsilon": 1.2}``."""
        self._loop.log_metrics(metrics)

    def describe_privacy(self, component: str, facts: dict[str, Any]) -> None:
        """State how ``component`` accounts its privacy in ``summary.json["privacy"][component]`` (the sampling
        its accountant assumed and the one the run used), e.g. ``{"sampling": "poisson", "sample_rate": 0.1}``."""
        self._loop.recorder.privacy[component] = dict(facts)

    def record_attack(self, entry: dict[str, Any]) -> None:
        """Append one attack result to ``summary.json["attacks"]``."""
        self._loop.record_attack(entry)

    def request_stop(self, reason: str) -> None:
        """Stop after the current round."""
        self._loop.request_stop(reason)
