"""What resume checks beyond the digests: the manifest's layout, and that each file is the one its slot names.

The manifest (:mod:`lightning_fl.federation.checkpoint`) promises integrity against accidents: a torn or partial
write, a file changed or lost after its round was committed, files of different rounds or clients mixed up (two
client files swapped, an older server file put back), a round that was never committed. Its SHA-256 digests catch
a changed file; the checks here catch a file that is intact but in the wrong place, even when someone updated the
digests to match: a client file must hold the client of its slot and the round its manifest entry names (the
round it was written in, at most the committed one), the server file the manifest's round. So an older client file
put back under the committed name, its digest re-hashed into the manifest, is refused: it holds an older round.

It does not promise integrity against someone who can write the run directory: they can rewrite the manifest's
digests along with a file. That would need a keyed MAC (HMAC) with a key kept outside the run directory; a run
directory is the user's own storage, and what it holds is loaded with the safe unpickler only
(``torch.load(weights_only=True)``), so a planted file can change results but never run code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["check_client_file", "check_manifest_layout", "check_server_file"]


def _check_entry(entry: Any, where: str) -> None:
    if not (isinstance(entry, Mapping) and isinstance(entry.get("path"), str) and isinstance(entry.get("sha256"), str)):
        raise ValueError(f"its {where} entry is {entry!r}, not {{'path': ..., 'sha256': ...}}")


def check_manifest_layout(manifest: Mapping[str, Any]) -> None:
    """Every entry of ``manifest`` is a ``{"path", "sha256"}`` pair; client slots are client numbers.

    Raises:
        ValueError: naming the first malformed entry (a null server entry included).

    Example:
        >>> check_manifest_layout({"round_idx": 1, "server": None, "clients": {}})
        Traceback (most recent call last):
        ...
        ValueError: its server entry is None, not {'path': ..., 'sha256': ...}
    """
    if not isinstance(manifest.get("round_idx"), int) or manifest["round_idx"] < 0:
        raise ValueError(f"its round_idx is {manifest.get('round_idx')!r}, not a round number")
    _check_entry(manifest.get("server"), "server")
    if manifest.get("initial_private") is not None:
        _check_entry(manifest["initial_private"], "initial_private")
    clients = manifest.get("clients")
    if not isinstance(clients, Mapping):
        raise ValueError(f"its clients entry is {clients!r}, not a mapping of client numbers to files")
    for slot, entry in clients.items():
        if not str(slot).isdigit():
            raise ValueError(f"its clients entry has the slot {slot!r}, not a client number")
        _check_entry(entry, f"clients[{slot!r}]")
        written = entry.get("round_idx")
        if not isinstance(written, int) or not 0 <= written <= manifest["round_idx"]:
            raise ValueError(
                f"its clients[{slot!r}] entry names round {written!r}, not a round up to the committed "
                f"{manifest['round_idx']}"
            )


def check_server_file(state: Mapping[str, Any], *, round_idx: int, path: str) -> None:
    """The server file named by a manifest of round ``round_idx`` holds that round.

    Raises:
        ValueError: when it holds another round (an older server file put back under the committed name).
    """
    held = state.get("round_idx") if isinstance(state, Mapping) else None
    if held != round_idx:
        raise ValueError(
            f"checkpoint {path!r} holds round {held!r} but the manifest commits round {round_idx}; the files were "
            "mixed up after the commit and the run cannot resume."
        )


def check_client_file(state: Mapping[str, Any], *, slot: int, round_idx: int, path: str) -> None:
    """The client file in the manifest's slot ``slot`` holds that client's state, written in round ``round_idx``.

    Raises:
        ValueError: when it holds another client (client files swapped after the commit) or another round (an
            older file put back).

    Example:
        >>> check_client_file({"client_id": 1, "round_idx": 0}, slot=1, round_idx=2, path="clients/client_1_r00002.pt")
        Traceback (most recent call last):
        ...
        ValueError: checkpoint 'clients/client_1_r00002.pt' holds client 1's state of round 0 but the manifest names round 2; the files were mixed up after the commit and the run cannot resume.
    """  # noqa: E501
    held = state.get("client_id") if isinstance(state, Mapping) else None
    if held != slot:
        raise ValueError(
            f"checkpoint {path!r} holds client {held!r} but the manifest puts it in the slot of client {slot}; the "
            "files were mixed up after the commit and the run cannot resume."
        )
    written = state.get("round_idx")
    if written != round_idx:
        raise ValueError(
            f"checkpoint {path!r} holds client {slot}'s state of round {written!r} but the manifest names round "
            f"{round_idx}; the files were mixed up after the commit and the run cannot resume."
        )
