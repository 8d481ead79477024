"""What keeps a run directory and its federation sound: the lock, the resume checks (changed settings, changed
files), durable CSV and summary after a real SIGKILL, clients' own secrets after a crash, and outlier updates."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch

from lightning_fl import ClientTransform, ClientUpdate, FederatedCallback, FederatedLoop
from lightning_fl.cli import main
from lightning_fl.contexts import derive_seed
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import KeyLocks, PaillierEncryption, SecureFedAvg
from lightning_fl.federation.run_lock import RunLock
from lightning_fl.private import private_state, reset_private_state
from tests.conftest import make_classifier
from tests.reliability.helpers import QUICKSTART, one_error_line

REPO = QUICKSTART.parents[1]


def _data(**kwargs) -> FederatedDataModule:
    options = {"num_clients": 3, "partition": "iid", "image_size": 8, "batch_size": 16, "seed": 0, **kwargs}
    return FederatedDataModule("digits", **options)


def _loop(output_dir, dm=None, **kwargs) -> FederatedLoop:
    torch.manual_seed(0)
    dm = dm or _data()
    options = {"num_rounds": 1, "clients_per_round": 3, "local_steps": 2, "eval_every": 0, **kwargs}
    return FederatedLoop(make_classifier(dm), dm, output_dir=output_dir, progress_bar=False, **options)


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


# -- the lock ----------------------------------------------------------------------------------------------


def test_a_second_run_in_a_locked_output_dir_is_refused_with_the_holder(tmp_path, capsys) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = RunLock(tmp_path / "run")
        lock.path.parent.mkdir()
        lock.path.write_text(json.dumps({"pid": holder.pid, "host": os.uname().nodename}))
        with pytest.raises(RuntimeError, match=rf"in use by another lightning-fl run \(pid {holder.pid} on "):
            _loop(tmp_path / "run").fit()
        args = ["fit", "-c", str(QUICKSTART), "--output_dir", str(tmp_path / "run"), "--data.image_size", "8"]
        assert main(args) == 2
        assert f"pid {holder.pid}" in one_error_line(capsys.readouterr().err)
        assert json.loads(lock.path.read_text())["pid"] == holder.pid  # the live run's lock stays
    finally:
        holder.kill()
        holder.wait()


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path) -> None:
    lock = RunLock(tmp_path)
    pid = _dead_pid()
    lock.path.write_text(json.dumps({"pid": pid, "host": os.uname().nodename}))
    with pytest.warns(UserWarning, match=rf"locked by pid {pid} .* no longer runs; taking the lock over"):
        _loop(tmp_path).fit()
    assert not lock.path.exists()  # released at the end of the run


# -- resume checks -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A committed one-round run."""
    run = tmp_path_factory.mktemp("finished")
    _loop(run).fit()
    return run


@pytest.mark.parametrize(
    ("change", "keys"),
    [
        ({"dm": {"num_clients": 4}}, ["data.num_clients: 3 -> 4", "data.client_indices"]),
        ({"dm": {"partition": "dirichlet"}}, ["data.partition: 'iid' -> 'dirichlet'"]),
        ({"seed": 1}, ["seed: 0 -> 1"]),
        ({"local_steps": 3}, ["loop.local_steps: 2 -> 3"]),
        ({"dm": {"image_size": 16}}, ["data.image_size", "model.init_args.image_size", "model layers"]),
        ({"defences": [KeyLocks(key_length=16)]}, ["model layers and shapes"]),
    ],
    ids=["num_clients", "partition", "seed", "local_steps", "model shape", "defence"],
)
def test_resume_refuses_a_run_that_changes_the_federation(finished, tmp_path, change, keys) -> None:
    dm = _data(**change.pop("dm", {}))
    loop = _loop(finished, dm, clients_per_round=3, num_rounds=2, **change)
    with pytest.raises(ValueError, match=r"resume=true but .* holds a run with other settings") as err:
        loop.prepare(resume=True)
    assert all(key in str(err.value) for key in keys), str(err.value)


def test_resume_accepts_more_rounds_of_the_same_federation(finished) -> None:
    loop = _loop(finished, num_rounds=2)
    loop.prepare(resume=True)
    assert loop.round_idx == 1


def test_resume_refuses_a_committed_file_that_changed(finished, tmp_path) -> None:
    run = tmp_path / "run"
    _loop(run).fit()
    server = _loop(run).checkpoint.server_path
    state = torch.load(server, weights_only=True)
    state["global_state"]["backbone.fc.bias"] += 1.0
    torch.save(state, server)
    with pytest.raises(ValueError, match=r"server_r00001.pt' does not match the SHA-256 in the manifest"):
        _loop(run, num_rounds=2).prepare(resume=True)


def test_the_cli_refuses_a_changed_federation_with_one_line(tmp_path, capsys) -> None:
    base = ["fit", "-c", str(QUICKSTART), "--output_dir", str(tmp_path), "--data.image_size", "8"]
    base += ["--loop.local_epochs", "1", "--loop.progress_bar", "false", "--loop.num_rounds", "1"]
    assert main(base) == 0
    capsys.readouterr()
    assert main([*base, "--data.num_clients", "8", "--resume", "true"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "data.num_clients: 10 -> 8" in line and "choose another output_dir" in line


# -- a real kill of the command ------------------------------------------------------------------------------


def _rows(path) -> list[dict]:
    return list(csv.DictReader(path.open())) if path.exists() else []


def test_sigkill_leaves_summary_and_csv_of_every_committed_round_and_resume_continues(tmp_path) -> None:
    run = tmp_path / "run"
    args = ["fit", "-c", str(QUICKSTART), "--output_dir", str(run), "--data.image_size", "8"]
    args += ["--data.num_clients", "4", "--loop.clients_per_round", "2", "--loop.local_epochs", "1"]
    args += ["--loop.progress_bar", "false"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    command = [sys.executable, "-m", "lightning_fl.cli", *args, "--loop.num_rounds", "500"]
    process = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(_rows(run / "logs" / "metrics.csv")) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL, stderr
    summary = json.loads((run / "summary.json").read_text())  # whole JSON, never half a file
    rows = _rows(run / "logs" / "metrics.csv")
    assert [int(r["round"]) for r in rows] == list(range(len(rows)))
    committed = json.loads((run / "manifest.json").read_text())["round_idx"]
    # per round: commit, then the CSV row, then the summary; the kill may fall between any two
    assert committed >= len(rows) >= summary["rounds_completed"] >= max(1, len(rows) - 1)
    assert (run / ".lightning-fl.lock").exists()

    with pytest.warns(UserWarning, match="which no longer runs; taking the lock over"):
        assert main([*args, "--loop.num_rounds", str(committed + 1), "--resume", "true"]) == 0
    rows = _rows(run / "logs" / "metrics.csv")
    assert [int(r["round"]) for r in rows] == list(range(committed + 1))  # no round twice, none missing
    summary = json.loads((run / "summary.json").read_text())
    assert [h["round"] for h in summary["history"]] == list(range(committed + 1))
    assert not list(run.rglob("*.tmp")) and not (run / ".lightning-fl.lock").exists()


# -- clients' own secrets ------------------------------------------------------------------------------------


class _Tracker(FederatedCallback):
    """Tells the client callback which client trains in which round."""

    def __init__(self, victim: int) -> None:
        self.victim, self.current, self.round = victim, -1, -1

    def on_client_fit_start(self, loop, client_id: int) -> None:
        self.current, self.round = client_id, loop.round_idx


def test_a_client_that_crashed_in_round_0_later_trains_with_its_own_key(tmp_path) -> None:
    import lightning as L

    victim, seen = 1, {}
    tracker = _Tracker(victim)

    class CrashAndRecord(L.Callback):
        def on_train_start(self, trainer, module) -> None:
            key = private_state(module)["backbone.body.0.1.lock.key"]
            seen[(tracker.round, tracker.current)] = key.clone()

        def on_train_batch_end(self, trainer, module, *_) -> None:
            if (tracker.round, tracker.current) == (0, victim):
                raise RuntimeError("client crashed")

    options = {"defences": [KeyLocks(key_length=16)], "callbacks": [tracker], "client_callbacks": [CrashAndRecord()]}
    loop = _loop(tmp_path, num_rounds=2, **options)
    with pytest.warns(UserWarning, match=rf"round 0: client {victim} failed and is dropped"):
        loop.fit()
    assert loop.history[0]["clients"] == [0, 2] and victim in loop.history[1]["clients"]
    own = _loop(tmp_path / "reference", defences=[KeyLocks(key_length=16)]).global_model
    reset_private_state(own, generator=torch.Generator().manual_seed(derive_seed(0, "private", victim)))
    expected = private_state(own)["backbone.body.0.1.lock.key"]
    assert torch.equal(seen[(1, victim)], expected)
    assert torch.equal(loop.clients[victim].private["backbone.body.0.1.lock.key"], expected)
    for other in (0, 2):
        assert not torch.equal(loop.clients[other].private["backbone.body.0.1.lock.key"], expected)
        assert not torch.equal(seen[(0, other)], expected)


# -- outlier updates -----------------------------------------------------------------------------------------


class _Huge(ClientTransform):
    """Client 1 sends an update of 3e38 everywhere: finite in float32, its norm overflows float32."""

    def __call__(self, update: ClientUpdate, *, ctx) -> ClientUpdate:
        if update.client_id != 1:
            return update
        return dataclasses.replace(update, delta={k: torch.full_like(v, 3e38) for k, v in update.delta.items()})


def test_a_huge_finite_update_is_dropped_with_the_client_and_the_reason(tmp_path) -> None:
    reference = _loop(tmp_path / "ref", clients_per_round=3)
    reference.fit()
    loop = _loop(tmp_path / "run", client_transforms=[_Huge()])
    with pytest.warns(UserWarning, match=r"round 0: update of client 1 is dropped: its norm .*e\+4\d exceeds "):
        loop.fit()
    assert loop.history[0]["clients"] == [0, 2]
    assert all(torch.isfinite(v).all() for v in loop.global_public_state().values())


def test_an_update_far_above_the_rounds_median_is_dropped(tmp_path) -> None:
    class Scaled(ClientTransform):
        def __call__(self, update, *, ctx):
            factor = 5e3 if update.client_id == 2 else 1.0
            return dataclasses.replace(update, delta={k: v * factor for k, v in update.delta.items()})

    loop = _loop(tmp_path, client_transforms=[Scaled()], max_update_norm=None)
    with pytest.warns(UserWarning, match=r"client 2 is dropped: its norm .* more than loop.max_update_norm_ratio=1000"):
        loop.fit()
    assert loop.history[0]["clients"] == [0, 1]
    off = _loop(tmp_path / "off", client_transforms=[Scaled()], max_update_norm=None, max_update_norm_ratio=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        off.fit()
    assert off.history[0]["clients"] == [0, 1, 2]


def test_an_encrypted_update_is_checked_by_its_client_before_encryption(tmp_path) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*below 2048 bits.*")
        he = PaillierEncryption(key_size=256, layers=["backbone.fc.bias"], packing=False)
        loop = _loop(tmp_path, aggregator=SecureFedAvg(), client_transforms=[_Huge(), he])
        with pytest.warns(UserWarning, match=r"client 1 is dropped: its norm .* before encryption exceeds"):
            loop.fit()
    assert loop.history[0]["clients"] == [0, 2]


@pytest.mark.parametrize(
    ("trainer", "named"),
    [
        ("{enable_checkpointing: true, logger: true}", "loop.trainer.enable_checkpointing"),
        ("{logger: true}", "loop.trainer.logger"),
    ],
)
def test_client_trainer_checkpoints_and_loggers_of_a_model_with_secrets_are_refused(
    tmp_path, capsys, monkeypatch, trainer: str, named: str
) -> None:
    monkeypatch.chdir(tmp_path)
    config = str(QUICKSTART.parent / "fedkl_digits.yaml")
    args = ["fit", "-c", config, "--output_dir", str(tmp_path / "run"), "--loop.num_rounds", "1"]
    assert main([*args, "--data.image_size", "8", "--loop.trainer", trainer]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert named in line and "private state ('backbone.body.0.1.lock.key'" in line, line
    assert list(tmp_path.iterdir()) == []  # no lightning_logs/, no run directory
