"""What counts as a client failure: the one kind of error a round survives.

A federation must outlive a client that crashes, as a real one outlives a phone that loses power; it must not
outlive a bug in its own server-side code. The boundary is where the code runs, not the exception's type:

* **A client failure** (:class:`ClientFailure`): any :class:`Exception` raised by the client's own work, i.e.
  its local training (``Trainer.fit`` of its model on its data: the user's ``training_step``, the data loading,
  the client's Trainer callbacks such as per-example DP) and its client transforms (clipping, noise,
  encryption). The loop drops that client for the round with a warning (and the traceback in the
  ``lightning_fl.federation.loop`` log); an update that arrives but is unsound (non-finite, wrong keys or shapes,
  a norm outlier) is dropped the same way by the update checks. Fewer than ``loop.min_clients`` kept updates
  still end the run. The warning is one line; the traceback is logged at DEBUG, or at ERROR when
  ``LIGHTNING_FL_TRACEBACK=1`` (:func:`log_failure`). A misconfigured client callback (an ``EarlyStopping`` on a
  metric the model never logs) is such a failure: every client is dropped with one line each, and the round
  ends the run with one line.
* **Everything else propagates**: errors in the loop's own steps around the fit (loading the client's state,
  building its update), in FL callbacks (``on_client_fit_end``, attacks at any leak point, also when a
  local-gradient listener runs inside the client's fit: :class:`ServerSideError`), in selection, aggregation,
  server transforms and evaluation, and every :class:`BaseException` that is not an ``Exception``
  (``KeyboardInterrupt``, ``SystemExit``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

__all__ = ["TRACEBACK_ENV", "ClientFailure", "ServerSideError", "client_work", "log_failure"]

TRACEBACK_ENV = "LIGHTNING_FL_TRACEBACK"
"""Set to 1 to get full tracebacks: of a run-time failure of ``lightning-fl``, and of every dropped client."""


class ClientFailure(Exception):
    """A client's own work (its training or a client transform) raised; the client is dropped for the round.

    Args:
        client_id: the client.
        stage: ``"training"`` or ``"client transform <name>"``.
        detail: what the client's work raised (its ``repr``, or a worker process' traceback); the exception itself
            is the ``__cause__`` when it was raised in this process.
    """

    def __init__(self, client_id: int, stage: str, detail: str) -> None:
        super().__init__(f"client {client_id} failed in {stage}: {detail}")
        self.client_id, self.stage, self.detail = client_id, stage, detail


class ServerSideError(RuntimeError):
    """A server-side component (a leak-point listener) raised while running inside a client's fit.

    Not the client's failure: :func:`client_work` lets it through, so the run stops with its cause.
    """


@contextlib.contextmanager
def client_work(client_id: int, stage: str) -> Iterator[None]:
    """Run a client's own work; its :class:`Exception` becomes a :class:`ClientFailure` (see the module doc).

    Example:
        >>> with client_work(3, "training"):
        ...     raise OSError("disk full")
        Traceback (most recent call last):
        ...
        lightning_fl.federation.failures.ClientFailure: client 3 failed in training: OSError('disk full')
    """
    try:
        yield
    except (ClientFailure, ServerSideError):
        raise
    except Exception as err:
        raise ClientFailure(client_id, stage, repr(err)) from err


def log_failure(logger: logging.Logger, failure: ClientFailure) -> None:
    """Log the traceback of a dropped client: at DEBUG, or at ERROR when ``LIGHTNING_FL_TRACEBACK=1``.

    The loop's one-line warning already says which client failed and why; a traceback per client buried a
    misconfigured callback under hundreds of lines.
    """
    level = logging.ERROR if os.environ.get(TRACEBACK_ENV) == "1" else logging.DEBUG
    logger.log(level, "client %s failed in %s", failure.client_id, failure.stage, exc_info=failure)
