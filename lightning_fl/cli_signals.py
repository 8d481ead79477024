"""Exit codes of ``lightning-fl`` and how it turns SIGINT and SIGTERM into them.

SIGTERM is raised like Ctrl+C (:class:`Terminated`), so a run stops between two writes (a checkpoint commit holds
it until done) and exits with the code a shell reports for the signal: 130 = 128 + SIGINT, 143 = 128 + SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from functools import partial

__all__ = [
    "EXIT_BAD_CONFIG",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_RUN_FAILED",
    "EXIT_TERMINATED",
    "Terminated",
    "exit_outside_the_run",
    "ignore_after_the_run",
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


def _run_as_command() -> bool:
    """Whether this process is the ``lightning-fl`` command (its script, or ``python -m lightning_fl.cli``)."""
    command = os.path.basename(sys.argv[0]) if sys.argv else ""
    return command == "lightning-fl" or list(getattr(sys, "orig_argv", ())[1:3]) == ["-m", "lightning_fl.cli"]


def _exit_at_once(code: int, *_: object) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def exit_outside_the_run() -> None:
    """In the ``lightning-fl`` command, make SIGINT and SIGTERM exit with 130 and 143 while the package imports,
    before :func:`sigterm_raises` takes over.

    Python's defaults would end the process by the signal itself (a return code of -2 or -15 to a parent that
    waits for it) or print a traceback. Nothing is being written then, so the process exits at once. A signal the
    shell ignores (a background job's SIGINT) stays ignored. In any other program this does nothing.
    """
    if not _run_as_command() or threading.current_thread() is not threading.main_thread():
        return
    for sig, code in ((signal.SIGINT, EXIT_INTERRUPTED), (signal.SIGTERM, EXIT_TERMINATED)):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, partial(_exit_at_once, code))


def ignore_after_the_run() -> None:
    """In the ``lightning-fl`` command, ignore SIGINT and SIGTERM once its work is done and its exit code known.

    The interpreter's shutdown (thread joins, freeing torch) takes a while, and Python resets its own handlers to
    the default action early in it, so a signal then would end the process by the signal (-2, -15) instead of the
    code the run earned; an ignored signal stays ignored. In any other program this does nothing.
    """
    if _run_as_command() and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` and SIGINT ``KeyboardInterrupt`` (main thread only), so
    a run stops between two writes; the previous handlers are restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _raise_terminated)
    interrupt = signal.getsignal(signal.SIGINT)
    if interrupt is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGINT, interrupt)


def interrupted(err: BaseException | None = None, resume_hint: str | None = None) -> int:
    """Print the one line of an interrupted or terminated run, with how to continue it (``resume_hint``, by default
    fit's), and return its exit code (130 or 143)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Lightning ignores SIGINT after the first one
    what = "terminated" if isinstance(err, Terminated) else "interrupted"
    hint = resume_hint or "a fit run continues from its last completed round with --resume true"
    print(f"lightning-fl: {what}; {hint}.", file=sys.stderr)
    return EXIT_TERMINATED if isinstance(err, Terminated) else EXIT_INTERRUPTED
