"""Shared fixtures: offline W&B, one torch thread per test worker, tiny federations on real digits."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

import pytest
import torch

from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.models import ImageClassifier

torch.set_num_threads(int(os.environ.get("LIGHTNING_FL_TEST_THREADS", "1")))


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
