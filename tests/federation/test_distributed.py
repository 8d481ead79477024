"""DDP: N processes launched once, clients split across ranks, rank 0 alone writes; same results as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_fl import FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.federation.distributed import _assign, ranks_requested
from tests.conftest import make_classifier

SCRIPT = Path(__file__).with_name("ddp_run.py")


def _script(output_dir: Path, devices: int) -> str:
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[2]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(output_dir), str(devices)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout


@pytest.mark.slow  # three processes each import torch and Lightning: ~30 s on the 2-core machine
def test_two_gloo_processes_train_each_client_once_and_equal_one_process(tmp_path) -> None:
    one, two = _script(tmp_path / "one", 1), _script(tmp_path / "two", 2)
    assert two.count("SUMMARY") == 1  # one summary, from rank 0
    history_one = json.loads(one.split("SUMMARY", 1)[1])
    history_two = json.loads(two.split("SUMMARY", 1)[1])
    for a, b in zip(history_one, history_two, strict=True):
        assert a["clients"] == b["clients"]
        assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=0.002)
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-6)
    fits = [json.loads((tmp_path / "two" / f"fits_rank{r}.json").read_text()) for r in (0, 1)]
    assert all(fits), "both ranks trained clients"
    for entry in history_two:
        trained = sorted(k for rank in fits for r, k in rank if r == entry["round"])
        assert trained == entry["clients"]  # every selected client exactly once
    written = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert written["history"] == history_two


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_notebook", "ddp_fork", "fsdp", "deepspeed"])
def test_strategies_that_cannot_run_a_federation_fail_before_training(tmp_path, strategy) -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16)
    with pytest.raises(ValueError, match=rf"loop\.trainer\.strategy='{strategy}' cannot run a federation"):
        FederatedLoop(make_classifier(dm), dm, trainer={"strategy": strategy, "devices": 2}, output_dir=tmp_path)


def test_one_device_needs_no_processes_and_auto_devices_must_be_explicit() -> None:
    assert ranks_requested({"strategy": "ddp", "devices": 1}) == 1
    assert ranks_requested({"strategy": "ddp", "devices": 2, "num_nodes": 2}) == 4
    with pytest.raises(ValueError, match=r"loop\.trainer\.devices='auto'"):
        ranks_requested({"strategy": "ddp", "devices": "auto"})


def test_clients_go_largest_first_to_the_least_loaded_rank() -> None:
    assert _assign({0: 10, 1: 50, 2: 30, 3: 25}, 2) == [[1, 0], [2, 3]]
