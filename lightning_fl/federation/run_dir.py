"""Whose run directory is it: a new run never writes over a run already there, unless told to replace it.

A run directory holds a run once it has its config, a committed round or a summary (:data:`RUN_MARKERS`).
``fit`` into such a directory must say what to do with it: continue it (``resume``), or replace it
(``overwrite``, which deletes its files first). :func:`claim_run_dir` decides under the run lock, so of several
runs started at once on one directory exactly one proceeds and the others write nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lightning_fl.federation.run_lock import RunLock

__all__ = ["RUN_MARKERS", "check_run_dir", "claim_run_dir", "clear_run_dir", "holds_run"]

RUN_MARKERS = ("config.yaml", "manifest.json", "summary.json")
"""Files a lightning-fl run writes first (its config), per committed round (manifest) and per round (summary)."""


def holds_run(output_dir: str | Path) -> bool:
    """Whether ``output_dir`` holds a lightning-fl run (any of :data:`RUN_MARKERS`).

    Example:
        >>> import tempfile
        >>> holds_run(tempfile.mkdtemp())
        False
    """
    return any((Path(output_dir) / name).exists() for name in RUN_MARKERS)


def check_run_dir(output_dir: str | Path, *, resume: bool, overwrite: bool, key: str = "output_dir") -> None:
    """Refuse a fresh run into a directory that holds a run, naming the three ways out.

    Raises:
        ValueError: if both ``resume`` and ``overwrite`` are set, or ``output_dir`` holds a run and neither is.

    Example:
        >>> import tempfile
        >>> run = Path(tempfile.mkdtemp())
        >>> (run / "summary.json").write_text("{}") and None
        >>> check_run_dir(run, resume=False, overwrite=False)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: output_dir=... holds a run; ... --resume true ..., another --output_dir, or --overwrite true ...
    """
    if resume and overwrite:
        raise ValueError("resume=true and overwrite=true contradict each other: continue the run or replace it.")
    if resume or overwrite or not holds_run(output_dir):
        return
    committed = (Path(output_dir) / "manifest.json").exists()
    cont = "use --resume true to continue it" if committed else "it has no committed round to --resume true from"
    raise ValueError(
        f"{key}={str(output_dir)!r} holds a run; {cont}, another --output_dir, or --overwrite true to replace it "
        "(its files are deleted)."
    )


def claim_run_dir(lock: RunLock, *, resume: bool, overwrite: bool) -> None:
    """Take the run lock of ``lock.path.parent`` and check, under it, that this run may write there.

    The lock is taken before anything else is written, so of several simultaneous starts only one gets here; a
    start that finds a run there once it holds the lock (the winner finished first) releases it and refuses.

    Raises:
        RuntimeError: another live run holds the lock (see :meth:`RunLock.check`).
        ValueError: see :func:`check_run_dir`.
    """
    lock.acquire()
    try:
        check_run_dir(lock.path.parent, resume=resume, overwrite=overwrite)
    except ValueError:
        lock.release()
        raise


def clear_run_dir(output_dir: str | Path, *, keep: Path) -> None:
    """Delete every file and folder of the run in ``output_dir`` except ``keep`` (the lock of the new run)."""
    for entry in Path(output_dir).iterdir():
        if entry == keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
