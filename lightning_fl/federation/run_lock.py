"""One run per output directory: a lock file naming the process (pid and host) that writes there.

Two runs writing the same checkpoints, CSV and summary would overwrite each other's rounds. The lock is created
atomically (``O_CREAT | O_EXCL``) when a run starts writing and removed when it ends. A lock left by a process
that no longer exists on this host (killed with SIGKILL, a crashed machine) is taken over with a warning. The
ranks a DDP run launches (the script re-run per rank) share their launcher's lock: :data:`LAUNCHER_PID_ENV`.
"""

from __future__ import annotations

import json
import os
import socket
import warnings
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
        self._held = False

    def holder(self) -> dict[str, Any] | None:
        """``{"pid": ..., "host": ...}`` of the lock's owner, or ``None`` when unlocked (or unreadable)."""
        try:
            holder = json.loads(self.path.read_text())
            return {"pid": int(holder["pid"]), "host": str(holder["host"])}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def check(self) -> None:
        """Raise when another live process holds the lock (a stale one is left for :meth:`acquire`).

        Raises:
            RuntimeError: naming the pid and host of the run that writes there.
        """
        holder = self.holder()
        if holder is None or self._held or self._launcher(holder) or not self._live(holder):
            return
        raise RuntimeError(
            f"output_dir {str(self.path.parent)!r} is in use by another lightning-fl run (pid {holder['pid']} on "
            f"{holder['host']}); wait for it to finish or choose another output_dir "
            f"(if that run is gone, delete {str(self.path)!r})."
        )

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
        """Take the lock, taking over a stale one with a warning.

        Raises:
            RuntimeError: see :meth:`check`.
        """
        if self._held:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self.check()
                holder = self.holder() or {"pid": "?", "host": "?"}
                warnings.warn(
                    f"output_dir {str(self.path.parent)!r} was locked by pid {holder['pid']} on {holder['host']}, "
                    "which no longer runs; taking the lock over.",
                    stacklevel=2,
                )
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as handle:
                handle.write(me)
            self._held = True
            return
        self.check()  # another run took it in between
        raise RuntimeError(f"could not take the lock {str(self.path)!r}; delete it if no run writes there.")

    def release(self) -> None:
        """Remove the lock if this object holds it."""
        if self._held:
            self.path.unlink(missing_ok=True)
            self._held = False
