"""A run directory is never overwritten without ``--overwrite true`` or ``--resume true``, and of several starts on
one directory only one writes: the others exit with 2 and write nothing, not even ``config.yaml``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lightning_fl.cli import main
from lightning_fl.federation.loop import FederatedLoop
from lightning_fl.federation.run_dir import check_run_dir
from tests.reliability.helpers import FAST, QUICKSTART, one_error_line


def _fit(output_dir, *extra: str) -> list[str]:
    return [
        "fit",
        "-c",
        str(QUICKSTART),
        "--output_dir",
        str(output_dir),
        *FAST,
        "--data.num_clients",
        "4",
        "--loop.clients_per_round",
        "2",
        *extra,
    ]


def _files(run) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-round run."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert main(_fit(run, "--loop.num_rounds", "2")) == 0
    return run


def test_fit_into_a_finished_run_is_refused_and_leaves_it_as_it_was(finished, capsys) -> None:
    before = _files(finished)
    assert main(_fit(finished, "--seed_everything", "3")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"output_dir={str(finished)!r} holds a run" in line
    assert "--resume true" in line and "another --output_dir" in line and "--overwrite true" in line
    assert _files(finished) == before


def test_overwrite_replaces_the_run_and_deletes_its_files(finished, tmp_path) -> None:
    run = tmp_path / "run"
    for name, data in _files(finished).items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(data)
    assert main(_fit(run, "--overwrite", "true")) == 0
    assert json.loads((run / "summary.json").read_text())["rounds_completed"] == 1
    assert json.loads((run / "manifest.json").read_text())["round_idx"] == 1
    assert not [p for p in run.rglob("*r00002*")]  # the replaced run's last checkpoint is gone
    saved = (run / "config.yaml").read_text()
    assert "overwrite: false" in saved and "resume: false" in saved  # actions on a directory, not settings


def test_a_run_dir_that_is_empty_or_not_a_run_is_used_as_it_is(tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    check_run_dir(tmp_path, resume=False, overwrite=False)
    with pytest.raises(ValueError, match="contradict"):
        check_run_dir(tmp_path, resume=True, overwrite=True)


def test_a_start_that_loses_the_race_for_the_lock_writes_nothing_and_exits_with_2(tmp_path, capsys, monkeypatch):
    """The winner takes the lock while the loser is still checking its config: the loser must not write."""
    run, winner = tmp_path / "run", subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    prepare = FederatedLoop.prepare

    def prepare_then_lose(loop: FederatedLoop, **kwargs) -> None:
        prepare(loop, **kwargs)
        run.mkdir(exist_ok=True)
        loop.lock.path.write_text(json.dumps({"pid": winner.pid, "host": os.uname().nodename}))

    monkeypatch.setattr(FederatedLoop, "prepare", prepare_then_lose)
    try:
        assert main(_fit(run)) == 2
        assert f"pid {winner.pid}" in one_error_line(capsys.readouterr().err)
        assert [p.name for p in run.iterdir()] == [".lightning-fl.lock"]  # the winner's lock, nothing of ours
    finally:
        winner.kill()
        winner.wait()


def test_a_start_that_gets_the_lock_after_the_winner_finished_refuses(finished, tmp_path, capsys, monkeypatch):
    """The winner finished between the loser's first check and its lock: the loser still must not overwrite."""
    run = tmp_path / "run"
    prepare = FederatedLoop.prepare

    def prepare_then_winner_finishes(loop: FederatedLoop, **kwargs) -> None:
        prepare(loop, **kwargs)
        run.mkdir(exist_ok=True)
        (run / "summary.json").write_bytes((finished / "summary.json").read_bytes())

    monkeypatch.setattr(FederatedLoop, "prepare", prepare_then_winner_finishes)
    assert main(_fit(run)) == 2
    assert "holds a run" in one_error_line(capsys.readouterr().err)
    assert sorted(p.name for p in run.iterdir()) == ["summary.json"]
