"""Checkpoints of a federated run, committed round by round: a kill at any moment leaves a resumable run.

Each round writes new, round-named files: the server's public state (``checkpoints/server_r<round>.pt``) and the
client-side state of every client that trained (``clients/client_<k>_r<round>.pt``). The round is committed by
the manifest (``manifest.json``), written last and atomically: it names the round, every file that belongs to it
(clients that did not train keep the file of their last round) with its SHA-256, and the fingerprint of the
settings that define the federation. Resume loads only what the manifest names, after checking the digests and
the fingerprint; files of a round that was never committed are deleted. Server and client state therefore always
come from the same round.

What the manifest promises (integrity against accidents, not against someone who can rewrite it) and the checks
beyond the digests are in :mod:`lightning_fl.federation.integrity`. The manifest holds file names and digests
only; private client state lives only in ``clients/`` (client-side storage) and never enters a server file.
Signals (Ctrl+C, SIGTERM) that arrive during a commit are held until its last file is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import signal
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from lightning_fl.contexts import ClientState
from lightning_fl.federation.integrity import check_client_file, check_manifest_layout, check_server_file
from lightning_fl.private import load_state_into, public_state

if TYPE_CHECKING:
    from lightning_fl.federation.client_store import ClientStore

__all__ = [
    "FORMAT",
    "Checkpoint",
    "RunParts",
    "atomic_write",
    "check_format",
    "check_regular_file",
    "describe_changes",
    "fingerprint_changes",
    "held_signals",
    "refuse_other_settings",
]

log = logging.getLogger(__name__)

FORMAT = 3
"""Version of what a run directory stores: the manifest's layout, its fingerprint's keys and the server file's
entries. A change to any of them bumps it, and a directory of another version is refused on resume with one line
(:func:`check_format`), never resumed wrongly. 2: the fingerprint holds every plug-in's settings, the server file
the run's privacy description. 3: the fingerprint holds the client Trainer options, norm bounds and evaluation
mode; each client file and its manifest entry hold the round that wrote it."""


def check_format(manifest: Mapping[str, Any], path: Path) -> None:
    """Refuse a manifest that another version of lightning-fl wrote (:data:`FORMAT`), naming the way out.

    Raises:
        ValueError: when ``manifest["format"]`` is a version other than :data:`FORMAT`.

    Example:
        >>> check_format({"format": 1}, Path("run/manifest.json"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: 'run/manifest.json' was written in format 1 by an older lightning-fl; this version stores ...
    """
    found = manifest.get("format")
    if found == FORMAT or not isinstance(found, int):
        return
    age = "an older" if found < FORMAT else "a newer"
    raise ValueError(
        f"{str(path)!r} was written in format {found} by {age} lightning-fl; this version stores format {FORMAT} "
        "and cannot resume it: run it again with another --output_dir (or --overwrite true), or resume it with "
        "the version that wrote it."
    )


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


def check_regular_file(path: Path) -> None:
    """Refuse a path that exists but is not a regular file: reading a named pipe blocks until someone writes to it.

    Raises:
        ValueError: naming the path and the fix.

    Example:
        >>> check_regular_file(Path("/dev/null"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: '/dev/null' is not a regular file (a named pipe, device or folder); ...
    """
    if path.exists() and not stat.S_ISREG(path.stat().st_mode):
        raise ValueError(
            f"{str(path)!r} is not a regular file (a named pipe, device or folder); a checkpoint is never one: "
            "remove it, or start the run again with another --output_dir."
        )


def _serialise(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block is done, then deliver them (main thread only, else a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda s, _: received.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(received):
            signal.raise_signal(sig)


def fingerprint_changes(stored: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (stored value, current value)}`` for every setting that differs between two fingerprints.

    Example:
        >>> fingerprint_changes({"data.num_clients": 4, "seed": 0}, {"data.num_clients": 3, "seed": 0})
        {'data.num_clients': (4, 3)}
    """
    keys = list(dict.fromkeys([*stored, *current]))
    return {k: (stored.get(k), current.get(k)) for k in keys if stored.get(k) != current.get(k)}


def describe_changes(changes: Mapping[str, tuple[Any, Any]]) -> str:
    """``key: old -> new`` for each changed setting, on one line.

    Example:
        >>> describe_changes({"data.batch_size": (32, 16), "data.partition": ("iid", "dirichlet")})
        "data.batch_size: 32 -> 16; data.partition: 'iid' -> 'dirichlet'"
    """
    return "; ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in changes.items())


def refuse_other_settings(output_dir: Path, changes: Mapping[str, tuple[Any, Any]]) -> ValueError:
    """The one-line refusal of a resume whose settings differ from the run's in ``output_dir``."""
    return ValueError(
        f"resume=true but {str(output_dir)!r} holds a run with other settings ({describe_changes(changes)}); "
        "resume with the settings of that run or choose another output_dir."
    )


class Stateful(Protocol):
    """A part whose state a checkpoint stores (``state_dict``) and restores (``load_state_dict``)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class RunParts:
    """What a run commits each round and restores on resume.

    Args:
        global_model: the global model (its public state is the server's file; its private layers the initial ones).
        components: the stateful server-side parts (selector, aggregator, transforms), in checkpoint order.
        callbacks: the FL callbacks (their ``state_dict``).
        recorder: the run's history and attack results.
        store: the client store (each client's own state, the initial private layers).
        fingerprint: computes the settings that define the federation (see
            :func:`~lightning_fl.federation.fingerprint.federation_fingerprint`).
    """

    global_model: nn.Module
    components: Sequence[Stateful]
    callbacks: Sequence[Stateful]
    recorder: Stateful
    store: ClientStore
    fingerprint: Callable[[], dict[str, Any]]


class Checkpoint:
    """Where one run commits its rounds (see the module docstring for the layout).

    Args:
        output_dir: the run directory.
        enabled: whether the loop commits after every round (reading a checkpoint works either way).
    """

    def __init__(self, output_dir: str | Path, *, enabled: bool = True) -> None:
        self.output_dir, self.enabled = Path(output_dir), enabled
        self._kept: dict[str, Any] = {"initial_private": None, "clients": {}}  # committed files still current
        self._fingerprint: dict[str, Any] | None = None

    def fingerprint(self, parts: RunParts) -> dict[str, Any]:
        """``parts.fingerprint()``, computed once: it is fixed for a run and hashes every client's partition."""
        if self._fingerprint is None:
            self._fingerprint = parts.fingerprint()
        return self._fingerprint

    @property
    def manifest_path(self) -> Path:
        """The commit record: the last committed round, its files and their digests, the fingerprint."""
        return self.output_dir / "manifest.json"

    @property
    def server_path(self) -> Path:
        """The committed server file (public state only).

        Raises:
            FileNotFoundError: when no round was committed yet.
        """
        return self.output_dir / self._committed()["server"]["path"]

    def client_path(self, client_id: int) -> Path:
        """The committed client-side file of ``client_id`` (private tensors); never part of the server's files.

        Raises:
            FileNotFoundError: when no round was committed yet; KeyError: when the client has no state yet.
        """
        return self.output_dir / self._committed()["clients"][str(client_id)]["path"]

    def _committed(self) -> dict[str, Any]:
        manifest = self.read_manifest()
        if manifest is None:
            raise FileNotFoundError(f"{str(self.manifest_path)!r} does not exist: no round was committed yet.")
        return manifest

    def read_manifest(self) -> dict[str, Any] | None:
        """The manifest of the last committed round, or ``None`` when there is none.

        Raises:
            ValueError: if the manifest exists but is not one lightning-fl wrote, or another version wrote it
                (:func:`check_format`).
        """
        if not self.manifest_path.exists():
            return None
        check_regular_file(self.manifest_path)
        try:
            manifest = json.loads(self.manifest_path.read_text())
            version = manifest.get("format")
        except (ValueError, AttributeError) as err:
            raise self._not_a_manifest(err) from None
        check_format(manifest, self.manifest_path)
        try:
            if version != FORMAT or not {"round_idx", "server", "clients"} <= set(manifest):
                raise ValueError("unknown layout")
            check_manifest_layout(manifest)
        except ValueError as err:
            raise self._not_a_manifest(err) from None
        return manifest

    def _not_a_manifest(self, reason: Exception) -> ValueError:
        return ValueError(
            f"{str(self.manifest_path)!r} is not a lightning-fl checkpoint manifest ({reason}); "
            "delete it or choose another output_dir."
        )

    # -- writing ---------------------------------------------------------------------------------------
    def save_run(self, parts: RunParts, *, round_idx: int, touched: Iterable[int]) -> None:
        """Commit the rounds before ``round_idx``: server state, the touched clients' state, then the manifest."""
        server = {
            "round_idx": round_idx,
            "global_state": {k: v.detach().cpu() for k, v in public_state(parts.global_model).items()},
            "components": [c.state_dict() for c in parts.components],
            "callbacks": [cb.state_dict() for cb in parts.callbacks],
            **parts.recorder.state_dict(),
        }
        self.save(
            server,
            round_idx=round_idx,
            clients=parts.store.state_dicts(touched),
            initial_private=parts.store.initial_private,
            fingerprint=self.fingerprint(parts),
        )

    def save(
        self,
        server: dict[str, Any],
        *,
        round_idx: int,
        clients: Mapping[int, dict[str, Any]],
        initial_private: dict[str, Any],
        fingerprint: dict[str, Any],
    ) -> None:
        """Write the round's files under round-named paths, then the manifest that commits them, then clean up."""
        manifest = {
            "format": FORMAT,
            "round_idx": round_idx,
            "fingerprint": fingerprint,
            "server": None,
            "initial_private": self._kept["initial_private"],
            "clients": dict(self._kept["clients"]),
        }
        with held_signals():
            manifest["server"] = self._write(f"checkpoints/server_r{round_idx:05d}.pt", server)
            if initial_private and manifest["initial_private"] is None:
                manifest["initial_private"] = self._write("clients/initial_private.pt", initial_private)
            for k, state in clients.items():  # the file and its entry name the round: an older file is caught
                entry = self._write(f"clients/client_{k}_r{round_idx:05d}.pt", {**state, "round_idx": round_idx})
                manifest["clients"][str(k)] = {**entry, "round_idx": round_idx}
            atomic_write(self.manifest_path, json.dumps(manifest, indent=1).encode())
            self._kept = {"initial_private": manifest["initial_private"], "clients": manifest["clients"]}
            self.remove_uncommitted(manifest)

    def _write(self, relative: str, obj: Any) -> dict[str, str]:
        data = _serialise(obj)
        atomic_write(self.output_dir / relative, data)
        return {"path": relative, "sha256": hashlib.sha256(data).hexdigest()}

    def remove_uncommitted(self, manifest: Mapping[str, Any] | None = None) -> list[Path]:
        """Delete checkpoint files the manifest does not name (older rounds, a round never committed, temp files)."""
        manifest = self.read_manifest() if manifest is None else manifest
        named = {self.output_dir / e["path"] for e in _entries(manifest)} if manifest else set()
        stale = [
            p
            for folder in ("checkpoints", "clients")
            for p in sorted((self.output_dir / folder).glob("*"))
            if p.is_file() and (p.suffix in (".pt", ".tmp")) and p not in named
        ]
        stale += [p for p in [self.manifest_path.with_name(f".{self.manifest_path.name}.tmp")] if p.exists()]
        for path in stale:
            path.unlink()
        return stale

    # -- reading ---------------------------------------------------------------------------------------
    def committed_files(self) -> list[Path]:
        """Every file the manifest names (empty without a manifest)."""
        manifest = self.read_manifest()
        return [self.output_dir / e["path"] for e in _entries(manifest)] if manifest else []

    def check_resumable(self, fingerprint: Mapping[str, Any]) -> dict[str, Any]:
        """The manifest, after checking that a run with ``fingerprint`` may continue it.

        Raises:
            ValueError: without a committed round, naming the settings that changed, or naming a file that is
                missing or whose digest does not match the manifest.
        """
        manifest = self.read_manifest()
        if manifest is None:
            raise ValueError(
                f"resume=true but {str(self.manifest_path)!r} does not exist, so no round was committed; "
                "drop --resume or set output_dir to the run to continue."
            )
        changes = fingerprint_changes(manifest.get("fingerprint", {}), fingerprint)
        if changes:
            raise refuse_other_settings(self.output_dir, changes)
        for entry in _entries(manifest):
            self._read(entry)  # every digest, before anything is restored
        return manifest

    def check_committed(self) -> list[Path]:
        """Every file the manifest names, after checking that each exists and matches its digest; nothing is
        unpickled (a truncated or changed file is named before any loader sees it).

        Raises:
            ValueError: naming the first file that is missing or differs from its digest.
        """
        manifest = self.read_manifest()
        entries = _entries(manifest) if manifest else []
        for entry in entries:
            self._verified(entry)
        return [self.output_dir / e["path"] for e in entries]

    def _verified(self, entry: Mapping[str, str]) -> bytes:
        path = self.output_dir / entry["path"]
        if not path.exists():
            raise ValueError(
                f"checkpoint {str(path)!r} named by the manifest is missing; the run cannot resume: put the file "
                f"back, or start the run again with another --output_dir (or --overwrite true)."
            )
        check_regular_file(path)
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ValueError(
                f"checkpoint {str(path)!r} does not match the SHA-256 in the manifest (changed or truncated after it "
                "was committed); the run cannot resume: put the committed file back, or start the run again with "
                "another --output_dir (or --overwrite true)."
            )
        return data

    def _read(self, entry: Mapping[str, str]) -> Any:
        return torch.load(io.BytesIO(self._verified(entry)), map_location="cpu", weights_only=True)

    def load_client(self, client_id: int, manifest: Mapping[str, Any] | None = None) -> ClientState:
        """The committed client-side state of ``client_id`` (client storage: private layers, keys).

        Raises:
            ValueError: when its file is missing, changed since the commit, or holds another client;
                KeyError: when the client has no committed state.
        """
        entry = (manifest or self._committed())["clients"][str(client_id)]
        state = self._read(entry)
        check_client_file(state, slot=client_id, round_idx=entry["round_idx"], path=entry["path"])
        return ClientState.from_state_dict(state)

    def restore_run(self, parts: RunParts) -> int | None:
        """Restore ``parts`` to the last committed round; returns the round to run next, ``None`` without one.

        Raises:
            ValueError: see :meth:`check_resumable`.
        """
        if self.read_manifest() is None:
            return None
        manifest = self.check_resumable(self.fingerprint(parts))
        state = self._read(manifest["server"])
        check_server_file(state, round_idx=manifest["round_idx"], path=manifest["server"]["path"])
        load_state_into(parts.global_model, state["global_state"])
        for component, c_state in zip(parts.components, state["components"], strict=True):
            component.load_state_dict(c_state)
        for cb, cb_state in zip(parts.callbacks, state["callbacks"], strict=True):
            cb.load_state_dict(cb_state)
        parts.recorder.load_state_dict(state)
        store = parts.store
        if manifest["initial_private"] is not None:  # the global model's own private layers never change
            store.restore_initial_private(self._read(manifest["initial_private"]))
            load_state_into(parts.global_model, store.initial_private)
        for k in manifest["clients"]:
            store.restore(self.load_client(int(k), manifest))
        self._kept = {"initial_private": manifest["initial_private"], "clients": dict(manifest["clients"])}
        log.info("resumed after round %d", state["round_idx"] - 1)
        return int(state["round_idx"])


def _entries(manifest: Mapping[str, Any]) -> list[Mapping[str, str]]:
    entries = [manifest["server"], manifest.get("initial_private"), *manifest["clients"].values()]
    return [e for e in entries if e is not None]
