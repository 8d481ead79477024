"""Whose run directory is it: a new run never writes over a run already there, unless told to replace it.

A run directory holds a run once it has its config, a committed round or a summary (:data:`RUN_MARKERS`), whether
``fit`` or ``attack`` wrote it. A new run into such a directory must say what to do with it: continue it
(``resume``, ``fit`` only), or replace it (``overwrite``, which deletes the files a run writes,
:data:`RUN_OUTPUTS`, and keeps any other file: a user's notes, another tool's output). :func:`claim_run_dir`
decides under the run lock, so of several runs started at once on one directory exactly one proceeds and the
others write nothing.
"""

from __future__ import annotations

import fnmatch
import shutil
import warnings
from pathlib import Path

from lightning_fl.federation.checkpoint import Checkpoint
from lightning_fl.federation.export import GLOBAL_MODEL_FILE
from lightning_fl.federation.run_lock import RunLock

__all__ = ["RUN_MARKERS", "RUN_OUTPUTS", "check_run_dir", "claim_run_dir", "clear_run_dir", "holds_run", "run_outputs"]

RUN_MARKERS = ("config.yaml", "manifest.json", "summary.json")
"""Files a lightning-fl run writes first (its config), per committed round (manifest) and per round (summary)."""

_TEMP = ".*.tmp"  # what an atomic write leaves when killed mid-write (checkpoint.atomic_write)

RUN_OUTPUTS: dict[str, tuple[str, ...]] = {
    ".": (*RUN_MARKERS, "curves.png", GLOBAL_MODEL_FILE, _TEMP),
    "checkpoints": ("server_r*.pt", _TEMP),
    "clients": ("client_*_r*.pt", "initial_private.pt", _TEMP),
    "logs": ("metrics.csv", "attacks.csv", _TEMP),
    "attacks": ("*.png",),
    "wandb": ("offline-run-*", "run-*", "latest-run", "debug.log", "debug-internal.log"),
}
"""What a ``fit`` or ``attack`` run writes: per folder of the run directory, fnmatch patterns of its entries (the
server and client checkpoints, the CSV logs, the attack grids, W&B's own run folders). ``overwrite`` deletes these
and nothing else."""


def holds_run(output_dir: str | Path) -> bool:
    """Whether ``output_dir`` holds a lightning-fl run (any of :data:`RUN_MARKERS`).

    Example:
        >>> import tempfile
        >>> holds_run(tempfile.mkdtemp())
        False
    """
    return any((Path(output_dir) / name).exists() for name in RUN_MARKERS)


def run_outputs(output_dir: str | Path) -> list[Path]:
    """The entries of ``output_dir`` that a run wrote (:data:`RUN_OUTPUTS`), files and W&B folders.

    Example:
        >>> import tempfile
        >>> run = Path(tempfile.mkdtemp())
        >>> for name in ("summary.json", "notes.txt"):
        ...     _ = (run / name).write_text("{}")
        >>> [path.name for path in run_outputs(run)]
        ['summary.json']
    """
    root = Path(output_dir)
    found = []
    for folder, patterns in RUN_OUTPUTS.items():
        where = root / folder
        if not where.is_dir():
            continue
        found += [p for p in sorted(where.iterdir()) if any(fnmatch.fnmatch(p.name, pat) for pat in patterns)]
    return found


def _resume_hint(output_dir: Path, *, can_resume: bool) -> str:
    if not can_resume:
        return "use"
    try:
        committed = Checkpoint(output_dir).read_manifest() is not None
    except ValueError:  # another manifest format, or damaged: --resume true would be refused
        return "it cannot be resumed (its manifest.json is of another lightning-fl version or damaged); use"
    return "use --resume true to continue it," if committed else "it has no committed round to --resume true from;"


def check_run_dir(
    output_dir: str | Path, *, resume: bool, overwrite: bool, can_resume: bool = True, key: str = "output_dir"
) -> None:
    """Refuse a fresh run into a directory that holds a run, naming the ways out.

    Args:
        output_dir: the run directory.
        resume: the run continues the one there.
        overwrite: the run replaces the one there.
        can_resume: whether the command can resume (``fit``) or not (``attack``): the message offers
            ``--resume true`` only where it exists.
        key: the config key of ``output_dir``, for the message.

    Raises:
        ValueError: if both ``resume`` and ``overwrite`` are set, or ``output_dir`` holds a run and neither is.

    Example:
        >>> import tempfile
        >>> run = Path(tempfile.mkdtemp())
        >>> (run / "summary.json").write_text("{}") and None
        >>> check_run_dir(run, resume=False, overwrite=False)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: output_dir=... holds a run; ... --resume true ... another --output_dir, or --overwrite true ...
    """
    if resume and overwrite:
        raise ValueError("resume=true and overwrite=true contradict each other: continue the run or replace it.")
    if resume or overwrite or not holds_run(output_dir):
        return
    hint = _resume_hint(Path(output_dir), can_resume=can_resume)
    raise ValueError(
        f"{key}={str(output_dir)!r} holds a run; {hint} another --output_dir, or --overwrite true to replace it "
        "(the files a run wrote there are deleted, other files are kept)."
    )


def claim_run_dir(lock: RunLock, *, resume: bool, overwrite: bool, can_resume: bool = True) -> None:
    """Take the run lock of ``lock.path.parent`` and check, under it, that this run may write there.

    The lock is taken before anything else is written, so of several simultaneous starts only one gets here; a
    start that finds a run there once it holds the lock (the winner finished first) releases it and refuses.

    Raises:
        RuntimeError: another live run holds the lock (see :meth:`RunLock.check`).
        ValueError: see :func:`check_run_dir`.
    """
    lock.acquire()
    try:
        check_run_dir(lock.path.parent, resume=resume, overwrite=overwrite, can_resume=can_resume)
    except ValueError:
        lock.release()
        raise


def clear_run_dir(output_dir: str | Path, *, keep: Path) -> None:
    """Delete what a run wrote in ``output_dir`` (:func:`run_outputs`) except ``keep`` (the lock of the new run);
    any other file stays, and a warning names what stayed."""
    root = Path(output_dir)
    for entry in run_outputs(root):
        if entry == keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for folder in RUN_OUTPUTS:
        if folder != "." and (root / folder).is_dir() and not any((root / folder).iterdir()):
            (root / folder).rmdir()
    kept = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p != keep)
    if kept:
        shown = ", ".join(kept[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else "")
        warnings.warn(
            f"--overwrite true replaced the run in {str(root)!r} and kept {len(kept)} file(s) no run wrote: {shown}.",
            stacklevel=2,
        )
