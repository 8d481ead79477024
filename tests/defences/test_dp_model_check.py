"""DP-SGD defences check the model against Opacus' layer rules when the loop is built: a BatchNorm model with Fed-CDP
is refused before any training, naming the layer and the fix; in the bench the reason is in the failed row."""

from __future__ import annotations

import csv

import pytest
from opacus.validators import ModuleValidator

from lightning_fl import FederatedLoop
from lightning_fl.bench import run_bench
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import FedCDP
from lightning_fl.models import ImageClassifier
from tests.bench.test_bench import MINI

REFUSAL = r"FedCDP cannot compute per-example gradients through BatchNorm backbone\.features\.1 \(BatchNorm2d\)"
FIX = r"`model = opacus\.validators\.ModuleValidator\.fix\(model\)` \(GroupNorm\)"


def _batch_norm_model(dm: FederatedDataModule) -> ImageClassifier:
    return ImageClassifier("convnet_small", **dm.model_options)  # conv, BatchNorm, ReLU blocks


def test_fed_cdp_refuses_a_batch_norm_model_when_the_loop_is_built_and_accepts_the_fixed_one(tmp_path) -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16, seed=0)
    options = {"num_rounds": 1, "output_dir": tmp_path / "run", "progress_bar": False}
    with pytest.raises(ValueError, match=f"{REFUSAL}: it mixes the examples of a batch; before training call {FIX}"):
        FederatedLoop(_batch_norm_model(dm), dm, defences=[FedCDP()], **options)
    assert not (tmp_path / "run").exists()
    fixed = ModuleValidator.fix(_batch_norm_model(dm))  # the fix the message names
    assert FederatedLoop(fixed, dm, defences=[FedCDP()], **options).num_rounds == 1


def test_a_failed_bench_row_shows_its_reason_in_the_table(tmp_path) -> None:
    settings = {
        **MINI,
        "model": {**MINI["model"], "init_args": {**MINI["model"]["init_args"], "backbone": "convnet_small"}},
        "only": {"defences": ["fed_cdp"], "threat_models": ["fedsgd_b1"]},
    }
    (row,) = run_bench(settings, tmp_path, print_=lambda _: None)
    (written,) = csv.DictReader((tmp_path / "bench.csv").open())
    for status in (row["status"], written["status"], (tmp_path / "bench.md").read_text()):
        assert "failed: ValueError: FedCDP cannot compute per-example gradients" in status
        assert "BatchNorm backbone.features.1 (BatchNorm2d)" in status and "ModuleValidator.fix(model)" in status
