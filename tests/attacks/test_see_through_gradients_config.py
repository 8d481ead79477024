"""configs/see_through_gradients.yaml: See-Through-Gradients' small conv-BN setting as a `lightning-fl attack` run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from lightning_fl.attacks.standalone import set_running_statistics
from lightning_fl.cli import main
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.models import ImageClassifier

CONFIG = str(Path(__file__).parents[2] / "configs" / "see_through_gradients.yaml")


@pytest.mark.usefixtures("cwd_with_finished_runs")
def test_the_config_runs_as_an_attack_command(tmp_path: Path) -> None:
    run = tmp_path / "stg"
    assert main(["attack", "-c", CONFIG, "--attack.init_args.max_iterations", "2", "--output_dir", str(run)]) == 0
    entry = json.loads((run / "summary.json").read_text())["attacks"][0]
    assert entry["attack"] == "see_through_gradients" and entry["num_images"] == 4


def test_the_broadcast_models_statistics_are_another_clients_data() -> None:
    data = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16, val_fraction=0.0)
    data.setup()
    model = ImageClassifier("conv_bn_small", **data.model_options).eval()
    client = data.client_train_set(1)
    set_running_statistics(model, client, batch_size=len(client))  # one batch: the statistics are that batch's
    first = next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    with torch.no_grad():
        seen = model.backbone[0]((client.tensors()[0] - model.input_mean) / model.input_std)
    assert not model.training and int(first.num_batches_tracked) == 1
    assert torch.allclose(first.running_mean, seen.mean(dim=(0, 2, 3)), atol=1e-5)
