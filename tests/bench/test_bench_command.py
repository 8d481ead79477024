"""``lightning-fl bench`` as a command: every run checked up front, selection flags, exit codes, its resume hint."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import lightning_fl.bench.command as command
import lightning_fl.bench.runner as runner
from lightning_fl.bench import load_settings
from lightning_fl.bench.runner import _worker_init, threads_per_job
from lightning_fl.cli import main
from tests.bench.test_bench import MINI
from tests.conftest import REPO

_CDP = MINI["defences"]["fed_cdp"]
_NOISE = "lightning_fl.defences.GaussianNoise"


def _broken(path: list[str], value: object) -> dict:
    settings = copy.deepcopy(MINI)
    target = settings
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return settings


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (_broken(["defences", "fed_cdp"], {"defences": [{"class_path": "lightning_fl.defences.FedCDPP"}]}), "FedCDPP"),
        (_broken(["defences", "fed_cdp", "loop"], {"num_roundz": 2}), "num_roundz"),
        (
            _broken(["defences", "fed_cdp"], {"defences": [{"class_path": _NOISE, "init_args": {"std": 0.01}}]}),
            f"std is not an option of {_NOISE}; its options: noise_std, unit; fix it in the config.",
        ),
        (_broken(["threat_models", "fedsgd_b1_trained", "leak_point"], "gradient"), "leak_point='gradient'"),
        (_broken(["threat_models", "fedsgd_b1_trained", "attack_rounds"], [99]), "attack_rounds has [99]"),
        (_broken(["data", "num_clients"], 0), "num_clients"),
        (_broken(["attacks"], {}), "attacks is empty"),
        (_broken(["threat_models", "fedsgd_b1", "dataa"], {}), "unknown keys ['dataa']"),
    ],
)
@pytest.mark.usefixtures("cwd_with_finished_runs")
def test_a_broken_run_anywhere_in_the_grid_exits_2_before_writing(tmp_path, capsys, settings, named) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump({**settings, "output_dir": str(tmp_path / "out")}))
    assert main(["bench", "-c", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("cwd_with_finished_runs")
def test_selection_flags_trim_the_grid_and_name_unknown_values(tmp_path, capsys) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump({**MINI, "output_dir": str(tmp_path / "out")}))
    assert main(["bench", "-c", str(config), "--threat_models", "fedsgd_b2"]) == 2
    assert "['fedsgd_b2'] not in the config's threat_models" in capsys.readouterr().err
    assert main(["bench", "-c", str(config), "--seeds", "0,x"]) == 2
    assert main(["bench", "-c", str(config), "--jobs", "0"]) == 2
    assert not (tmp_path / "out").exists()
    selected = ["--defences", "none", "--threat_models", "fedsgd_b1", "--seeds", "0", "--attacks", "ig"]
    assert main(["bench", "-c", str(config), *selected, "--output_dir", str(tmp_path / "out")]) == 0
    assert [p.name for p in (tmp_path / "out" / "cells").glob("*.json")] == ["none__ig__fedsgd_b1__s0.json"]
    assert (  # the command that made the table, and resumes it, names every flag given
        f"--defences none --attacks ig --threat_models fedsgd_b1 --seeds 0 --output_dir {tmp_path / 'out'} --jobs 1"
        in (tmp_path / "out" / "bench.md").read_text()
    )


@pytest.mark.usefixtures("cwd_with_finished_runs")
def test_a_failed_run_exits_1_and_an_interrupted_bench_prints_its_own_resume_hint(tmp_path, capsys, monkeypatch):
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump({**MINI, "output_dir": str(tmp_path / "out")}))
    monkeypatch.setattr(
        runner,
        "_run",
        lambda kind, payload, *_: (
            {"status": "failed: RuntimeError: broke"}
            if kind == "utility"
            else {name: {"status": "ok"} for name in payload}
        ),
    )
    assert main(["bench", "-c", str(config)]) == 1
    assert "bench row(s) failed" in capsys.readouterr().err

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "_run", interrupt)
    assert main(["bench", "-c", str(config), "--defences", "none"]) == 130
    err = capsys.readouterr().err
    assert "a bench continues from its finished runs when the same command runs again" in err
    assert "--defences none" in err and "--resume true" not in err


def test_each_job_process_takes_its_share_of_the_cores() -> None:
    threads = torch.get_num_threads()
    try:
        _worker_init(threads_per_job(2, cores=2), os.getppid())
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert threads_per_job(1, cores=16) == 16 and threads_per_job(32, cores=16) == 1


_BENCH_WITH_WORKERS = """
import multiprocessing, os, time
from lightning_fl.bench.runner import _Executor

executor = _Executor(2)
executor.pool.submit(os.getpid).result()  # its workers are started (and set up) once there is work
print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by a PID 1 that does not reap, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_the_workers_of_a_bench_killed_with_sigkill_die_with_it() -> None:
    """They trained on (into the output directory) and held its run lock: the next bench was refused until they
    ended, which idle ones never did (they wait for work on a queue the dead bench still held open in them)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's lightning_fl
    bench = subprocess.Popen([sys.executable, "-c", _BENCH_WITH_WORKERS], stdout=subprocess.PIPE, env=env)
    workers = [int(pid) for pid in bench.stdout.readline().split()]
    try:
        assert workers and all(_running(pid) for pid in workers)
        bench.kill()
        bench.wait()
        deadline = time.monotonic() + 10
        while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_running(pid) for pid in workers)
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_cifar10_preset_reads_torchvision_files_under_data_root(tmp_path, monkeypatch) -> None:
    import pickle

    import numpy as np
    from torchvision.datasets import cifar

    from lightning_fl.bench.command import check_grid

    folder = tmp_path / "cifar-10-batches-py"  # torchvision's layout: pickled batches of 32x32x3 uint8 rows
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (20, 3072), dtype=np.uint8), "labels": list(range(10)) * 2}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [str(i) for i in range(10)]}))
    monkeypatch.setattr(cifar, "check_integrity", lambda *_: True)  # the real files' md5 sums, not these
    settings = load_settings("configs/bench_cifar10.yaml", quick=True)
    settings["data"] = {**settings["data"], "root": str(tmp_path), "num_clients": 5}
    check_grid(settings)  # every run of the preset builds on the files found under data.root
    assert settings["data"]["dataset"] == "cifar10" and settings["data"].get("download") is False
    assert json.dumps(settings)  # plain data, as a worker process receives it


def test_a_preset_starts_from_its_base_and_overrides_it(tmp_path) -> None:
    base = load_settings("configs/bench_digits.yaml", quick=True)
    (tmp_path / "base.yaml").write_text(Path("configs/bench_digits.yaml").read_text())
    (tmp_path / "faces.yaml").write_text(
        "base: base.yaml\noutput_dir: runs/faces\ndata: {dataset: lfw_faces}\nquick: {seeds: [1]}\n"
    )
    settings = load_settings(tmp_path / "faces.yaml", quick=True)
    assert settings["data"] == {**base["data"], "dataset": "lfw_faces"} and settings["seeds"] == [1]
    assert settings["defences"] == base["defences"] and settings["output_dir"] == "runs/faces"
    (tmp_path / "loop.yaml").write_text("base: loop.yaml\n")
    with pytest.raises(ValueError, match="leads back to itself"):
        load_settings(tmp_path / "loop.yaml")


@pytest.mark.usefixtures("cwd_with_finished_runs")
def test_a_second_bench_into_an_output_dir_in_use_exits_2_and_writes_nothing(tmp_path, capsys, monkeypatch) -> None:
    """Two benches writing one table race on bench.md and on each other's runs (each saw the other's runs locked
    and failed those rows): the bench holds the output directory's run lock, so the second one stops at once."""
    import os

    from lightning_fl.bench import run_bench
    from lightning_fl.federation import RunLock

    config, out = tmp_path / "bench.yaml", tmp_path / "out"
    config.write_text(yaml.safe_dump({**MINI, "output_dir": str(out)}))
    lock = RunLock(out)
    lock.acquire()  # the first bench, still running
    try:
        assert main(["bench", "-c", str(config)]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"output_dir {str(out)!r} is in use by another lightning-fl run (pid {os.getpid()}" in line
        with pytest.raises(RuntimeError, match="is in use by another lightning-fl run"):
            run_bench(MINI, out, print_=lambda _: None)
        assert sorted(p.name for p in out.iterdir()) == [".lightning-fl.lock"]
    finally:
        lock.release()

    def another_bench_starts_meanwhile(settings: object) -> None:  # both passed the first check: one wins the lock
        lock.acquire()

    monkeypatch.setattr(command, "check_grid", another_bench_starts_meanwhile)
    try:
        assert main(["bench", "-c", str(config)]) == 2
        assert "is in use by another lightning-fl run" in capsys.readouterr().err
        assert sorted(p.name for p in out.iterdir()) == [".lightning-fl.lock"]
    finally:
        lock.release()


@pytest.mark.parametrize("stored", [None, "another grid's"])
@pytest.mark.usefixtures("cwd_with_finished_runs")
def test_report_only_before_any_cell_finished_names_the_fix(tmp_path, capsys, stored) -> None:
    """It crashed drawing zero panels (ZeroDivisionError, exit 1); then the command and run_bench checked it each in
    its own words, the command by any ``cells/*.json`` (a cell of another selection passed it)."""
    from lightning_fl.bench import run_bench

    config, out = tmp_path / "bench.yaml", tmp_path / "out"
    config.write_text(yaml.safe_dump({**MINI, "output_dir": str(out)}))
    if stored:  # a finished cell of other settings: not one of this grid's
        (out / "cells").mkdir(parents=True)
        (out / "cells" / "none__ig__fedsgd_b1__0.json").write_text(json.dumps({"fingerprint": "other settings"}))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["bench", "-c", str(config), "--report_only"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    with pytest.raises(ValueError) as raised:
        run_bench(MINI, out, report_only=True, print_=lambda _: None)
    assert str(raised.value) in line  # one check, one message, from the command and from Python
    assert f"--report_only: no cell of this grid has finished in {str(out)!r}; run the bench without" in line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.parametrize(
    "preset", ["configs/bench_lfw.yaml", "configs/bench_photos_resnet.yaml", "configs/bench_photos_convnet.yaml"]
)
def test_the_faces_and_resnet_presets_build_every_run(preset: str) -> None:
    from lightning_fl.bench.command import check_grid

    settings = load_settings(preset, quick=True)
    check_grid(settings)  # every utility and attack run of the preset builds (data, model, defences, attacks)
    assert settings["output_dir"].endswith("_quick") and settings["output_dir"] != "runs/bench_photos_quick"


@pytest.mark.usefixtures("cwd_with_finished_runs")
def test_a_selection_flag_picks_from_the_whole_config_not_only_its_default_selection(tmp_path, capsys) -> None:
    """``only:`` is the preset's default grid; ``--threat_models`` names any threat model of the config (a quick grid
    that drops ``aggregate_k4`` still runs it when asked)."""
    settings = {**MINI, "only": {"threat_models": ["fedsgd_b1"]}, "output_dir": str(tmp_path / "out")}
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump(settings))
    assert sorted(load_settings(config, chosen_elsewhere=["threat_models"])["threat_models"]) == sorted(
        MINI["threat_models"]
    )
    assert list(load_settings(config)["threat_models"]) == ["fedsgd_b1"]
    assert main(["bench", "-c", str(config), "--threat_models", "nope"]) == 2
    assert str(sorted(MINI["threat_models"])) in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "preset", ["configs/bench_digits.yaml", "configs/bench_photos.yaml", "configs/bench_cifar10.yaml"]
)
def test_a_quick_grid_selects_one_seed_that_seeds_widens_to_the_presets_three(preset: str) -> None:
    """The quick budgets on the preset's seeds: ``--quick --seeds 0,1,2`` (a quick grid's one seed is a selection)."""
    assert load_settings(preset, quick=True)["seeds"] == [0]
    assert load_settings(preset, quick=True, chosen_elsewhere=["seeds"])["seeds"] == [0, 1, 2]
