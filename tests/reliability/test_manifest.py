"""Resume trusts a file only in its own slot: digests catch a changed file, these checks a misplaced one.

Before: two client files swapped (with the manifest's digests updated to match) resumed with other clients'
secrets; a corrupt file of a round never committed (``server_r00009.pt``) blocked resume; a manifest with a null
server entry failed with ``'NoneType' object is not subscriptable``. What the manifest does not promise (integrity
against someone who rewrites it) is in docs/architecture.md, "Checkpoints and resume".
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from lightning_fl.cli import main
from lightning_fl.federation.checkpoint import Checkpoint
from tests.reliability.helpers import FAST, QUICKSTART, one_error_line

KEY_LOCK = ["--defences", "[{class_path: lightning_fl.defences.KeyLocks, init_args: {key_length: 8}}]"]


@pytest.fixture
def run(tmp_path):
    """A finished one-round key-lock run: the clients that trained have committed client files (their locks)."""
    run = tmp_path / "run"
    assert main(["fit", "--config", str(QUICKSTART), "--output_dir", str(run), *FAST, *KEY_LOCK]) == 0
    return run


def _resume(run, *extra: str) -> list[str]:
    args = ["--resume", "true", "--loop.num_rounds", "2", *extra]
    return ["fit", "--config", str(QUICKSTART), "--output_dir", str(run), *FAST, *KEY_LOCK, *args]


def _edit_manifest(run, edit) -> None:
    manifest = json.loads((run / "manifest.json").read_text())
    edit(manifest)
    (run / "manifest.json").write_text(json.dumps(manifest))


def _rewrite(run, entry: dict, state: dict) -> None:
    """Replace the file of ``entry`` by ``state`` and update its digest, as a careless repair would."""
    torch.save(state, run / entry["path"])
    entry["sha256"] = hashlib.sha256((run / entry["path"]).read_bytes()).hexdigest()


def test_resume_refuses_swapped_client_files_even_with_matching_digests(run, capsys) -> None:
    slots = sorted(json.loads((run / "manifest.json").read_text())["clients"], key=int)[:2]

    def swap(manifest: dict) -> None:
        clients = manifest["clients"]
        clients[slots[0]], clients[slots[1]] = clients[slots[1]], clients[slots[0]]

    _edit_manifest(run, swap)
    capsys.readouterr()
    assert main(_resume(run)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"holds client {slots[1]} but the manifest puts it in the slot of client {slots[0]}" in line


def test_resume_refuses_a_server_file_of_another_round_even_with_a_matching_digest(run, capsys) -> None:
    def older(manifest: dict) -> None:
        state = torch.load(run / manifest["server"]["path"], weights_only=True)
        _rewrite(run, manifest["server"], {**state, "round_idx": 0})

    _edit_manifest(run, older)
    capsys.readouterr()
    assert main(_resume(run)) == 2
    assert "holds round 0 but the manifest commits round 1" in one_error_line(capsys.readouterr().err)


def test_a_corrupt_uncommitted_server_file_does_not_block_resume(run) -> None:
    corrupt = run / "checkpoints" / "server_r00009.pt"
    corrupt.write_bytes(b"\x00not a checkpoint")
    assert main(_resume(run)) == 0
    assert not corrupt.exists()
    assert Checkpoint(run).read_manifest()["round_idx"] == 2


def test_a_manifest_with_a_null_server_entry_is_refused_with_one_line(run, capsys) -> None:
    _edit_manifest(run, lambda manifest: manifest.update(server=None))
    capsys.readouterr()
    assert main(_resume(run)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "is not a lightning-fl checkpoint manifest (its server entry is None" in line
