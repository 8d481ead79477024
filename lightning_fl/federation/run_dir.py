"""Whose run directory is it: a new run never writes over a run already there, unless told to replace it.

A run directory holds a run once it has its config, a committed round or a summary (:data:`RUN_MARKERS`), whether
``fit`` or ``attack`` wrote it. A new run into such a directory must say what to do with it: continue it
(``resume``, ``fit`` only), or replace it (``overwrite``). :func:`claim_run_dir` decides under the run lock, so of
several runs started at once on one directory exactly one proceeds and the others write nothing.

A run records which entries of its directory it wrote, in :data:`RUN_RECORD`: when it takes the lock it notes what
is already there, and when it releases the lock it adds every entry that appeared since (a run killed before that
is accounted for by the next start, from the noted entries). ``overwrite`` deletes exactly the recorded entries: a
user's notes, plots and W&B runs, a project's own ``config.yaml``, survive, a symlink is removed as a link and never
followed, and a directory is removed only when the run created it and nothing else is left in it. A directory
that holds a run but no record (written by an older lightning-fl, or not a run at all) is not overwritten.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from lightning_fl.federation.checkpoint import Checkpoint, atomic_write
from lightning_fl.federation.export import GLOBAL_MODEL_FILE
from lightning_fl.federation.run_lock import RunLock

__all__ = [
    "RUN_MARKERS",
    "RUN_OUTPUTS",
    "RUN_RECORD",
    "check_run_dir",
    "claim_run_dir",
    "clear_run_dir",
    "holds_run",
    "open_run_dir",
    "record_written",
    "run_outputs",
    "writing_run",
    "written_entries",
]

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
server and client checkpoints, the CSV logs, the attack grids, W&B's own run folders): where a run's outputs are
looked for (the bench's listings); ``overwrite`` deletes what :data:`RUN_RECORD` names instead."""

RUN_RECORD = ".lightning-fl-files.json"
"""The run's record of its directory: ``written`` (entries the run wrote, relative POSIX paths) and ``before``
(entries there when the current session took the lock, ``null`` once it released it)."""


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
        manifest = Checkpoint(output_dir).read_manifest()
    except ValueError:  # another manifest format, or damaged: --resume true would be refused
        return "it cannot be resumed (its manifest.json is of another lightning-fl version or damaged); use"
    if manifest is None:
        return "it has no committed round to --resume true from;"
    rounds = _configured_rounds(output_dir)
    if rounds is not None and manifest.get("round_idx") == rounds:  # --resume true alone would train nothing
        return f"it finished its {rounds} rounds (--resume true with a larger --loop.num_rounds adds rounds); use"
    return "use --resume true to continue it,"


def _configured_rounds(output_dir: Path) -> int | None:
    """``loop.num_rounds`` of the run's ``config.yaml`` (written by the command), or ``None`` when unreadable."""
    import yaml

    try:
        rounds = yaml.safe_load((output_dir / "config.yaml").read_text())["loop"]["num_rounds"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return rounds if isinstance(rounds, int) else None


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
    if overwrite and holds_run(output_dir) and _read_record(Path(output_dir)) is None:
        raise ValueError(
            f"{key}={str(output_dir)!r} holds files of a run that recorded none of them ({RUN_RECORD} is missing: "
            "an older lightning-fl wrote it, or it is not a run), so --overwrite true cannot tell its files from "
            "yours; choose another --output_dir or delete the old run's files yourself."
        )
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
    Once claimed, the directory's entries are noted in :data:`RUN_RECORD`, and the release records what the run
    wrote.

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
    root = lock.path.parent
    _write_record(root, written=written_entries(root), before=sorted(_entries(root)))
    lock.at_release(lambda: _write_record(root, written=written_entries(root), before=None))


def open_run_dir(lock: RunLock, *, resume: bool, overwrite: bool) -> None:
    """Claim the run directory for a ``fit`` (:func:`claim_run_dir`) and, with ``overwrite``, clear the run there;
    nothing to do when the caller (the ``lightning-fl`` command) claimed it already.

    Raises:
        RuntimeError, ValueError: see :func:`claim_run_dir`.
    """
    if lock.held:
        return
    claim_run_dir(lock, resume=resume, overwrite=overwrite)
    if overwrite:
        clear_run_dir(lock.path.parent)


@contextlib.contextmanager
def writing_run(lock: RunLock, checkpoint: Checkpoint, *, resume: bool, overwrite: bool) -> Iterator[None]:
    """Hold the run directory while a ``fit`` writes it: created and claimed (:func:`open_run_dir`), a resumed run's
    uncommitted files removed, the lock released when the block ends.

    Raises:
        RuntimeError, ValueError: see :func:`claim_run_dir`.
    """
    lock.path.parent.mkdir(parents=True, exist_ok=True)
    open_run_dir(lock, resume=resume, overwrite=overwrite)
    try:
        if resume:
            checkpoint.remove_uncommitted()
        yield
    finally:
        lock.release()


def _entries(root: Path) -> set[str]:
    """Every file, folder and symlink under ``root`` as relative POSIX paths; symlinks are listed, never entered."""
    found = set()
    for folder, folders, files in os.walk(root):  # followlinks=False
        where = PurePosixPath(Path(folder).relative_to(root).as_posix())
        found.update(str(where / name) for name in [*folders, *files])
    return found - {".lightning-fl.lock", RUN_RECORD}


def _read_record(root: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((root / RUN_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("written"), list):
        return None
    return record


def _write_record(root: Path, *, written: list[str], before: list[str] | None) -> None:
    atomic_write(root / RUN_RECORD, json.dumps({"written": written, "before": before}, indent=1).encode())


def _inside(path: str) -> bool:
    """A relative path with no ``..``: a record entry that cannot name anything outside the run directory."""
    parts = PurePosixPath(path).parts
    return bool(parts) and not PurePosixPath(path).is_absolute() and ".." not in parts


def written_entries(output_dir: str | Path) -> list[str]:
    """The entries of ``output_dir`` that its run wrote, by :data:`RUN_RECORD`, and that are still there.

    The recorded ones, plus, while a session holds the lock (or was killed holding it), every entry that appeared
    since it took it.

    Example:
        >>> import tempfile
        >>> run = Path(tempfile.mkdtemp())
        >>> _ = (run / "notes.txt").write_text("mine")
        >>> _write_record(run, written=[], before=["notes.txt"])
        >>> _ = (run / "summary.json").write_text("{}")
        >>> written_entries(run)
        ['summary.json']
    """
    root = Path(output_dir)
    record, now = _read_record(root), _entries(root)
    if record is None:
        return []
    written = {p for p in record["written"] if isinstance(p, str) and _inside(p)}
    if isinstance(record.get("before"), list):
        written |= now - set(record["before"])
    return sorted(written & now)


def record_written(output_dir: str | Path, *names: str) -> None:
    """Add ``names`` (paths relative to ``output_dir``) to the run's record of what it wrote, for files a run writes
    after it released its lock (the exported global model); nothing to do where the run kept no record.

    Example:
        >>> import tempfile
        >>> run = Path(tempfile.mkdtemp())
        >>> _write_record(run, written=[], before=None)
        >>> _ = (run / "global_model.safetensors").write_bytes(b"")
        >>> record_written(run, "global_model.safetensors"); written_entries(run)
        ['global_model.safetensors']
    """
    root = Path(output_dir)
    record = _read_record(root)
    if record is not None:
        _write_record(root, written=sorted({*written_entries(root), *names}), before=record.get("before"))


def _through_symlink(root: Path, relative: str) -> bool:
    """Whether a folder on the way from ``root`` to ``relative`` is a symlink (deleting there would follow it)."""
    parts = PurePosixPath(relative).parts[:-1]
    return any((root.joinpath(*parts[: i + 1])).is_symlink() for i in range(len(parts)))


def clear_run_dir(output_dir: str | Path) -> None:
    """Delete the entries the run in ``output_dir`` wrote (:func:`written_entries`) and nothing else; a warning
    names the files that stay.

    Files and symlinks are unlinked (a symlink as a link: what it points to stays); a folder is removed only when the
    run created it and it is empty once the run's files are gone; nothing under a symlinked folder is touched.
    """
    root = Path(output_dir)
    written = [p for p in written_entries(root) if not _through_symlink(root, p)]
    for relative in written:
        path = root / relative
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
    for relative in sorted(written, key=lambda p: -len(PurePosixPath(p).parts)):  # deepest folders first
        path = root / relative
        if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
            path.rmdir()
    _write_record(root, written=[], before=sorted(_entries(root)))
    kept = sorted(p for p in _entries(root) if not (root / p).is_dir() or (root / p).is_symlink())
    if kept:
        shown = ", ".join(kept[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else "")
        warnings.warn(
            f"--overwrite true replaced the run in {str(root)!r} and kept {len(kept)} file(s) it did not write: "
            f"{shown}.",
            stacklevel=2,
        )
