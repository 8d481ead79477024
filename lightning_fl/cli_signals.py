"""Exit codes of ``lightning-fl`` and how it turns SIGINT and SIGTERM into them.

SIGTERM is raised like Ctrl+C (:class:`Terminated`), so a run stops between two writes (a checkpoint commit holds
it until done) and exits with the code a shell reports for the signal: 130 = 128 + SIGINT, 143 = 128 + SIGTERM.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

__all__ = [
    "EXIT_BAD_CONFIG",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_RUN_FAILED",
    "EXIT_TERMINATED",
    "Terminated",
    "interrupted",
    "sigterm_raises",
]

EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_CONFIG, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143
"""Exit codes of ``lightning-fl``: 2 only before anything is written; 130 = 128 + SIGINT and 143 = 128 + SIGTERM,
as shells report them."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl+C: the run stops between two writes (a checkpoint commit holds it until done)."""


def _raise_terminated(*_: object) -> None:
    raise Terminated


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` (main thread only); the previous handler is restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def interrupted(err: BaseException | None = None) -> int:
    """Print the one line of an interrupted or terminated run and return its exit code (130 or 143)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Lightning ignores SIGINT after the first one
    what = "terminated" if isinstance(err, Terminated) else "interrupted"
    print(
        f"lightning-fl: {what}; a fit run continues from its last completed round with --resume true.",
        file=sys.stderr,
    )
    return EXIT_TERMINATED if isinstance(err, Terminated) else EXIT_INTERRUPTED
