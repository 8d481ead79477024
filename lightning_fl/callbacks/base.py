"""FederatedCallback: hooks named for when they run in a round, and the three leak points.

Hook order in one round::

    on_round_start(federation, round_idx, selected)
    for each selected client:
        on_client_fit_start(federation, client_id)
        on_local_gradient(federation, view, ground_truth)    # type-2 leak: every local step, if overridden
        on_client_fit_end(federation, update)                # the raw update, before client transforms
        on_client_update(federation, view, ground_truth)     # type-1 leak: what the server receives
    on_aggregate_end(federation, view, ground_truth)         # type-0 leak: the aggregate that is broadcast
    on_round_end(federation, round_idx, metrics)

``federation`` is the read-only :class:`~lightning_fl.view.FederationView` of the run; ``view`` is a
:class:`~lightning_fl.messages.ServerView` (all an attack may use); ``ground_truth`` is kept apart for scoring.
The loop builds views and ground truth only for hooks a callback overrides and for the events it
:meth:`~FederatedCallback.wants`, so unused leak points, rounds and local steps cost nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_fl.messages import ClientUpdate, GroundTruth, ServerView

if TYPE_CHECKING:
    from lightning_fl.view import FederationView

__all__ = ["FederatedCallback"]


class FederatedCallback:
    """Base class of loop-level callbacks; override the hooks you need.

    Hooks receive a read-only :class:`~lightning_fl.view.FederationView` first, as Lightning callbacks
    receive the Trainer: read it (``round_idx``, ``spec``, ``output_dir``, ``loggers``; reads are copies), report
    through ``log_metrics``/``record_attack``/``request_stop``, and change a client's own state only through
    ``set_client_extra``.

    Attributes:
        needs_privacy_ledger: whether it reads the spent epsilon, so the run needs a privacy ledger (a DP defence).
    """

    needs_privacy_ledger: bool = False

    def listens_to(self, hook: str) -> bool:
        """Whether the loop should call ``hook`` on this callback; narrow it so unused leak points cost nothing."""
        return True

    def wants(self, hook: str, *, round_idx: int, client_id: int | None = None, step: int | None = None) -> bool:
        """Whether the loop should build the view of one event at a leak-point ``hook`` for this callback.

        Asked for ``on_local_gradient`` once per client fit with ``step=None`` (any step of it: whether to tap the
        client's gradients at all) and then per local step; for ``on_client_update`` per client; for
        ``on_aggregate_end`` with ``client_id=None``. Building a view copies the model, so an attack that wants one
        step of one round should say so here rather than discard the other views.
        """
        return True

    def check_fit(self, federation: FederationView) -> None:
        """Before anything is written (:meth:`FederatedLoop.prepare`, after the components' set-up and a resume's
        restore): raise a ``ValueError`` naming the setting and the fix to refuse the run (a budget that not even
        the next round fits in)."""

    def on_fit_start(self, federation: FederationView) -> None:
        """Before the first round (also after a resume)."""

    def on_fit_end(self, federation: FederationView) -> None:
        """After the last round."""

    def on_round_start(self, federation: FederationView, round_idx: int, selected: list[int]) -> None:
        """A round begins with the selected clients."""

    def on_client_fit_start(self, federation: FederationView, client_id: int) -> None:
        """A selected client is about to train."""

    def on_local_gradient(self, federation: FederationView, view: ServerView, ground_truth: GroundTruth) -> None:
        """Type-2 leak point: one local mini-batch gradient, as released by the client's optimiser step."""

    def on_client_fit_end(self, federation: FederationView, update: ClientUpdate) -> None:
        """A client finished training; ``update`` is before client-side transforms."""

    def on_client_update(self, federation: FederationView, view: ServerView, ground_truth: GroundTruth) -> None:
        """Type-1 leak point: the update as the server receives it (after client-side transforms)."""

    def on_aggregate_end(self, federation: FederationView, view: ServerView, ground_truth: GroundTruth) -> None:
        """Type-0 leak point: the aggregate delta the server broadcasts (after server transforms)."""

    def on_round_end(self, federation: FederationView, round_idx: int, metrics: dict[str, float]) -> None:
        """A round finished; ``metrics`` is its history entry."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
