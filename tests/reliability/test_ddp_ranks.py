"""DDP ranks never take the machine down: more devices than exist are refused before anything is launched, and
every launched rank dies with the process that launched it. No test here launches more than 2 processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest

from lightning_fl import FederatedLoop
from lightning_fl.cli import main
from lightning_fl.datamodules import FederatedDataModule
from tests.conftest import make_classifier
from tests.reliability.helpers import FAST, QUICKSTART, one_error_line

TOO_MANY = (os.cpu_count() or 1) + 1


def _never_launch(*_: object, **__: object) -> None:
    raise AssertionError("ranks were launched")


def test_fit_refuses_more_cpu_devices_than_the_machine_has_before_launching(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(L.Fabric, "launch", _never_launch)  # where Lightning starts the ranks: nothing may get there
    trainer = f"{{accelerator: cpu, strategy: ddp, devices: {TOO_MANY}}}"
    run = tmp_path / "run"
    assert main(["fit", "-c", str(QUICKSTART), "--output_dir", str(run), *FAST, "--loop.trainer", trainer]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"loop.trainer.devices={TOO_MANY} asks for {TOO_MANY} processes" in line
    assert f"use at most {TOO_MANY - 1}" in line
    assert not run.exists()


def test_the_loop_refuses_more_devices_than_exist(tmp_path) -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=8)
    with pytest.raises(ValueError, match=rf"devices={TOO_MANY} asks for {TOO_MANY} processes"):
        FederatedLoop(make_classifier(dm), dm, trainer={"strategy": "ddp", "devices": TOO_MANY}, output_dir=tmp_path)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


@pytest.mark.slow  # two processes each import torch and Lightning: ~30 s on the 2-core machine
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_launched_rank_dies_with_its_launcher(tmp_path) -> None:
    repo = QUICKSTART.parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    args = ["fit", "-c", str(QUICKSTART), "--output_dir", str(tmp_path / "run"), "--data.image_size", "16"]
    args += ["--loop.num_rounds", "200", "--loop.progress_bar", "false"]
    args += ["--loop.trainer", "{accelerator: cpu, strategy: ddp, devices: 2}"]
    launcher, ranks = subprocess.Popen([sys.executable, "-m", "lightning_fl.cli", *args], cwd=repo, env=env), []
    try:
        deadline = time.monotonic() + 120
        while not (ranks := _children(launcher.pid)) and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.2)
        assert ranks, "no rank was launched"
        launcher.send_signal(signal.SIGKILL)  # the rank is still importing: it would go on to wait for its launcher
        launcher.wait()
        deadline = time.monotonic() + 60
        while any(map(_alive, ranks)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(map(_alive, ranks)), f"ranks {ranks} outlived their launcher"
    finally:
        launcher.kill()
        launcher.wait()
        for rank in filter(_alive, ranks):
            os.kill(rank, signal.SIGKILL)
