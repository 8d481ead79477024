"""The bench's W&B run carries the bench's settings in ``wandb.config`` (issue 33)."""

from __future__ import annotations

from pathlib import Path

import torch
from torchvision.utils import save_image

import lightning_fl.bench.runner as runner
from lightning_fl.bench import run_bench
from tests.bench.test_bench import MINI
from tests.wandb_offline import offline_run


def _picture(rows: list, path: Path, **_: object) -> Path:
    save_image(torch.zeros(3, 2, 2), path)  # the plots are not under test here
    return path


def test_the_bench_wandb_run_holds_its_settings(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr(runner.report, "write_scatter", _picture)
    monkeypatch.setattr(runner.report, "write_heatmap", _picture)
    settings = {**MINI, "only": {"defences": ["none"], "attacks": ["ig"]}}
    run_bench(settings, tmp_path, wandb_project="bench-test", jobs=1, print_=lambda _: None)  # one tiny cell
    config = offline_run(tmp_path)["config"]
    assert config["data"]["dataset"] == "digits" and config["loop"]["num_rounds"] == 2
    assert list(config["defences"]) == ["none"] and config["seeds"] == [0] and config["jobs"] == 1
    assert config["command"].startswith("lightning-fl bench")
