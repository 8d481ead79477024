"""Shared fixtures: offline W&B, no cached command schema, one torch thread per test worker, tiny federations on real
digits, and the guard that keeps every test out of the repository's ``runs/`` (tests write and read only their own
temporary folders)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ["LIGHTNING_FL_CACHE_DIR"] = ""  # no cached parser schema (lightning_fl.cli_schema): tests build the parsers

import pytest
import torch

from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.models import ImageClassifier

torch.set_num_threads(int(os.environ.get("LIGHTNING_FL_TEST_THREADS", "1")))

REPO = Path(__file__).parents[1]
REPO_RUNS = REPO / "runs"
"""The repository's run folder: ``make quickstart``, the README's commands and a user's runs write there, a test
never does (:func:`_repository_runs_untouched`)."""


def runs_state(root: Path, *, depth: int | None = None) -> dict[str, tuple[int, int]]:
    """``(mtime_ns, size)`` of every entry under ``root`` down to ``depth`` levels (all with ``None``), by relative
    path: two states differ when an entry was created, deleted, renamed onto or written (a folder's own mtime
    changes when an entry is created in it)."""
    state: dict[str, tuple[int, int]] = {}
    if not root.is_dir():
        return state
    for folder, dirs, files in os.walk(root):
        level = len(Path(folder).relative_to(root).parts)
        for name in dirs + files:
            path = Path(folder) / name
            try:
                stat = path.lstat()
            except FileNotFoundError:  # removed while we walked
                continue
            state[str(path.relative_to(root))] = (stat.st_mtime_ns, stat.st_size)
        if depth is not None and level + 1 >= depth:
            dirs.clear()
    return state


def _runs_changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


def _fail_on_runs_changes(before: dict, after: dict, where: str) -> None:
    if changed := _runs_changes(before, after):
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        pytest.fail(
            f"{where} created or changed {shown} under {REPO_RUNS}; tests write only under tmp_path: pass "
            "--output_dir / output_dir=tmp_path (a config's output_dir and the defaults are relative to the working "
            "directory). Under pytest-xdist a test running beside it may be the one.",
            pytrace=False,
        )


@pytest.fixture(autouse=True, scope="session")
def _repository_runs_untouched_by_the_session():
    """Fail the session when anything under ``<repo>/runs`` was created or changed, at any depth."""
    before = runs_state(REPO_RUNS)
    yield
    _fail_on_runs_changes(before, runs_state(REPO_RUNS), "the test session")


@pytest.fixture(autouse=True)
def _repository_runs_untouched(request):
    """Fail the test that created or changed an entry of ``<repo>/runs`` (its first two levels: a run directory and
    its files and folders; deeper writes are caught for the whole session)."""
    before = runs_state(REPO_RUNS, depth=2)
    yield
    _fail_on_runs_changes(before, runs_state(REPO_RUNS, depth=2), request.node.nodeid)


@pytest.fixture(autouse=True)
def _fixed_global_seed() -> None:
    """Every test starts from the same global RNG state, so results never depend on which tests ran before
    (pytest-xdist distributes tests differently from run to run)."""
    import random

    import numpy as np

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def plugin_context(
    global_state: dict | None = None, *, client_id: int = 0, num_clients: int = 2, clients_per_round: int = 2
):
    """A :class:`ClientContext` for calling one plug-in (transform, aggregator) on its own, outside a loop."""
    from lightning_fl.federation import ClientContext, FederationSpec

    state = dict(global_state or {})
    spec = FederationSpec(
        num_clients=num_clients,
        clients_per_round=clients_per_round,
        num_rounds=1,
        local_epochs=1,
        local_steps=None,
        seed=0,
        batch_size=1,
        num_train_samples=(1,) * num_clients,
        update_keys=tuple(state),
    )
    return ClientContext(spec=spec, round_idx=0, global_state=state, client_id=client_id)


def make_classifier(dm: FederatedDataModule, **kwargs) -> ImageClassifier:
    """The sigmoid DLG LeNet classifier standardised on ``dm``'s statistics."""
    options = {"backbone": "lenet_dlg", "lr": 2e-3, **kwargs}
    return ImageClassifier(**dm.model_options, **options)


def three_keylock_clients(output_dir, **loop_options):
    """One round of three IID key-locked digit clients, one local step each: the smallest federation with secrets."""
    from lightning_fl import FederatedLoop
    from lightning_fl.defences import KeyLocks

    dm = FederatedDataModule("digits", num_clients=3, partition="iid", image_size=16, seed=0)
    options = {"num_rounds": 1, "clients_per_round": 3, "local_steps": 1, "checkpoint": False, "progress_bar": False}
    return FederatedLoop(
        make_classifier(dm), dm, defences=[KeyLocks(key_length=16)], output_dir=output_dir, **options, **loop_options
    )


def one_step_attack_loop(output_dir, *, callbacks: list, client_transforms: list = (), defences: list = ()):
    """One round, one client, one SGD step on one 16x16 digit: the setting where a single gradient leaks (DLG)."""
    from lightning_fl import FederatedLoop

    dm = FederatedDataModule("digits", num_clients=2, partition="iid", batch_size=1, image_size=16)
    torch.manual_seed(0)
    return FederatedLoop(
        make_classifier(dm, optimizer="sgd", lr=0.1),
        dm,
        num_rounds=1,
        clients_per_round=1,
        local_steps=1,
        eval_every=0,
        defences=defences,
        callbacks=callbacks,
        client_transforms=client_transforms,
        output_dir=output_dir,
        checkpoint=False,
        progress_bar=False,
    )


@pytest.fixture
def tiny_digits() -> FederatedDataModule:
    """4 clients of 16x16 digits, iid: fast enough for loop mechanics tests."""
    return FederatedDataModule("digits", num_clients=4, partition="iid", image_size=16, batch_size=32, seed=0)


BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` by path (opacus installs a ``benchmarks`` package that shadows the folder),
    with its helpers (``_config``, ``_timing``, ``_results``) importable as the scripts expect when run as
    ``python benchmarks/x.py``."""
    for module_name in ("_config", "_timing", "_results", name):
        if module_name not in sys.modules:
            spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / f"{module_name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
    return sys.modules[name]


def load_breaching_parity() -> ModuleType:
    """``benchmarks/breaching_parity.py`` with the benchmark scripts it imports by name (run as a script, they sit
    beside it on the path)."""
    for dependency in ("analytic_attack", "label_recovery", "see_through_gradients"):
        load_benchmark(dependency)
    return load_benchmark("breaching_parity")


COMMAND_DEFAULT_RUNS = ("runs/lightning-fl", "runs/attack", "runs/bench")
"""Where ``fit``/``test``, ``attack`` and ``bench`` write when neither the command line nor the config names an
``output_dir``."""


def _output_dirs(settings: object) -> list[str]:
    """Every ``output_dir`` value anywhere in a loaded YAML config (top level, ``quick:`` presets)."""
    if isinstance(settings, dict):
        found = [settings["output_dir"]] if isinstance(settings.get("output_dir"), str) else []
        return found + [d for value in settings.values() for d in _output_dirs(value)]
    return [d for value in settings for d in _output_dirs(value)] if isinstance(settings, list) else []


@pytest.fixture
def cwd_with_finished_runs(tmp_path_factory, monkeypatch) -> Path:
    """Run the test in a working directory whose ``runs/`` holds a finished run in every folder a shipped config or
    a command writes to by default, as a working tree does after ``make quickstart`` and the README's commands: a
    command a test starts without its own ``--output_dir`` meets a run there and is refused, so the test fails."""
    import yaml

    work = tmp_path_factory.mktemp("working_tree")
    configs = sorted((REPO / "configs").glob("*.yaml"))
    for name in {*COMMAND_DEFAULT_RUNS, *(d for c in configs for d in _output_dirs(yaml.safe_load(c.read_text())))}:
        run = work / name
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.yaml").write_text("seed_everything: 0\n")
        (run / "summary.json").write_text('{"rounds_completed": 1}\n')
    monkeypatch.chdir(work)
    return work
