"""One run per output directory: a lock file naming the process (pid and host) that writes there.

Two runs writing the same checkpoints, CSV and summary would overwrite each other's rounds. A run holds an
exclusive ``flock`` on the lock file while it writes there (the kernel releases it when the process dies, so a
killed run leaves no live lock), checks that the file it locked is still the one at the path (a lock file removed
and created again in between is retried), and only then writes its pid and host into it; it removes the file when
it ends. So of any number of starters exactly one holds the lock, and a lock file that is empty because its
writer has not written yet reads as held. A file naming a live process that holds no ``flock`` (written by an
older lightning-fl) also counts as held; one naming a process that no longer exists on this host is taken over
with a warning. The ranks a DDP run launches (the script re-run per rank) share their launcher's lock:
:data:`LAUNCHER_PID_ENV`. The lock is its owner's alone: a forked child (a bench's or a fit's worker process)
closes its copy of the descriptor at once, so it never keeps the ``flock`` of an owner that was killed; without
that, the workers of a bench killed with SIGKILL held it as long as they lived, and every later run was refused
naming a pid that no longer ran.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["LAUNCHER_PID_ENV", "RunLock", "launched_rank"]

LAUNCHER_PID_ENV = "LIGHTNING_FL_LAUNCHER_PID"
"""Set by a process before it launches DDP ranks (they inherit it): the pid of the run that owns the lock."""


def launched_rank() -> bool:
    """Whether this process is a rank launched by another lightning-fl process (it writes nothing, holds no lock).

    Example:
        >>> launched_rank()
        False
    """
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    return launcher is not None and launcher != str(os.getpid())


_HELD: set[RunLock] = set()
"""The locks this process holds, until released (their descriptors are what a forked child must not keep)."""


def _forget_in_child() -> None:
    """In a forked child: close the copies of the held locks' descriptors (closing a copy leaves the owner's
    ``flock`` in place; it only stops the child from keeping it after the owner dies)."""
    for lock in list(_HELD):
        if lock._fd is not None:
            os.close(lock._fd)
            lock._fd = None
            lock._at_release.clear()
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    """The lock file ``output_dir/.lightning-fl.lock``.

    Args:
        output_dir: the run directory.

    Example:
        >>> import tempfile
        >>> lock = RunLock(tempfile.mkdtemp())
        >>> lock.acquire(); lock.path.exists(), lock.holder()["pid"] == os.getpid()
        (True, True)
        >>> lock.release(); lock.path.exists()
        False
    """

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir) / ".lightning-fl.lock"
        self._fd: int | None = None
        self._at_release: list[Callable[[], None]] = []

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def holder(self) -> dict[str, Any] | None:
        """``{"pid": ..., "host": ...}`` of the lock's owner, or ``None`` when unlocked (or not yet written)."""
        try:
            holder = json.loads(self.path.read_text())
            return {"pid": int(holder["pid"]), "host": str(holder["host"])}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _refuse(self, holder: dict[str, Any] | None) -> RuntimeError:
        who = f"pid {holder['pid']} on {holder['host']}" if holder else "a run that is starting"
        return RuntimeError(
            f"output_dir {str(self.path.parent)!r} is in use by another lightning-fl run ({who}); wait for it to "
            f"finish or choose another output_dir (if that run is gone, delete {str(self.path)!r})."
        )

    def check(self) -> None:
        """Raise when another live process holds the lock (a stale one is left for :meth:`acquire`).

        Raises:
            RuntimeError: naming the pid and host of the run that writes there.
        """
        holder = self.holder()
        if self.held or (holder is not None and self._launcher(holder)):
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:  # no lock file (or not ours to read): nobody holds it
            return
        try:
            free = _try_flock(fd, attempts=1)
        finally:
            os.close(fd)  # closing drops the probe's own flock
        if not free or (holder is not None and self._live(holder)):
            raise self._refuse(holder if not free else self.holder())

    @staticmethod
    def _launcher(holder: dict[str, Any]) -> bool:
        """The holder launched this rank: the lock is this run's own."""
        launcher = os.environ.get(LAUNCHER_PID_ENV)
        return launched_rank() and holder["host"] == socket.gethostname() and str(holder["pid"]) == launcher

    @staticmethod
    def _live(holder: dict[str, Any]) -> bool:
        if holder["host"] != socket.gethostname():
            return True  # cannot tell from here: assume it runs
        return holder["pid"] == os.getpid() or _alive(holder["pid"])

    def acquire(self) -> None:
        """Take the lock, taking over a stale one (its writer no longer runs) with a warning.

        Raises:
            RuntimeError: see :meth:`check`.
        """
        if self.held:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if not _try_flock(fd, attempts=5):
                os.close(fd)
                raise self._refuse(self.holder())
            with contextlib.suppress(FileNotFoundError):
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    break  # the file we locked is the one at the path
            os.close(fd)  # its holder removed it after we opened it: lock the new one
        holder = self.holder()
        if holder is not None and self._live(holder):
            os.close(fd)
            raise self._refuse(holder)
        if holder is not None:
            warnings.warn(
                f"output_dir {str(self.path.parent)!r} was locked by pid {holder['pid']} on {holder['host']}, "
                "which no longer runs; taking the lock over.",
                stacklevel=2,
            )
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
        os.fsync(fd)
        self._fd = fd
        _HELD.add(self)

    def at_release(self, action: Callable[[], None]) -> None:
        """Run ``action`` in :meth:`release`, while the lock is still held (e.g. record what the run wrote)."""
        self._at_release.append(action)

    def release(self) -> None:
        """Run the :meth:`at_release` actions and remove the lock if this object holds it."""
        if self._fd is None:
            return
        try:
            while self._at_release:
                self._at_release.pop(0)()
        finally:
            self.path.unlink(missing_ok=True)  # before the flock goes: a waiter then finds the path changed
            os.close(self._fd)
            self._fd = None
            _HELD.discard(self)


def _try_flock(fd: int, *, attempts: int) -> bool:
    """Take an exclusive ``flock`` on ``fd`` without blocking, trying ``attempts`` times 10 ms apart (another
    starter's :meth:`RunLock.check` holds it for an instant)."""
    for attempt in range(attempts):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < attempts:
                time.sleep(0.01)
    return False
