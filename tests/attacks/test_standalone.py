"""run_attack and the `lightning-fl attack` command: one attack on one batch, summary.json and the grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightning_fl.attacks import IDLGAttack, infer_labels
from lightning_fl.attacks.standalone import client_view, run_attack
from lightning_fl.cli import main
from lightning_fl.datamodules import FederatedDataModule
from tests.conftest import make_classifier

CONFIGS = Path(__file__).parents[2] / "configs"
ENTRY_KEYS = {"attack", "round", "client", "leak_point", "mse", "psnr", "ssim", "lpips", "label_accuracy"}


def test_run_attack_writes_summary_and_grid(tmp_path: Path) -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16)
    torch.manual_seed(0)
    entry = run_attack(
        IDLGAttack(max_iterations=5, progress_bar=False),
        data=dm,
        model=make_classifier(dm),
        batch_size=2,
        output_dir=tmp_path,
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["attacks"] == [entry] and set(entry) >= ENTRY_KEYS
    assert entry["num_images"] == 2 and Path(entry["image"]).is_file()


def test_client_view_shares_only_public_tensors_and_metadata() -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16)
    images, labels = dm.sample_batch(0, 4, seed=0)
    view = client_view(make_classifier(dm), images, labels, num_classes=10, local_steps=2, lr=0.1)
    assert view.kind == "update" and view.metadata["batch_size"] == 2 and view.metadata["local_steps"] == 2
    flat = torch.cat([t.flatten() for t in view.tensors.values()])
    assert not torch.isin(images.flatten(), flat).all()
    with pytest.raises(ValueError, match="multiple of local_steps=3"):
        client_view(make_classifier(dm), images, labels, num_classes=10, local_steps=3)


def test_attack_command_runs_a_config_and_writes_summary(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(
        [
            "attack",
            "--config",
            str(CONFIGS / "idlg_lenet_digits.yaml"),
            "--attack.init_args.max_iterations",
            "3",
            "--attack.init_args.progress_bar",
            "false",
            "--data.image_size",
            "16",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    entry = json.loads((tmp_path / "summary.json").read_text())["attacks"][0]
    assert entry["attack"] == "idlg" and entry["label_accuracy"] == 1.0
    assert "psnr" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["dlg_lenet_digits", "idlg_lenet_digits", "ig_lenet_digits"])
def test_attack_configs_parse(name: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:  # jsonargparse prints the resolved config and exits
        main(["attack", "--config", str(CONFIGS / f"{name}.yaml"), "--print_config"])
    assert exit_info.value.code == 0
    assert "class_path: lightning_fl.attacks" in capsys.readouterr().out


def test_infer_labels_is_exported_for_standalone_use() -> None:
    assert infer_labels(torch.tensor([[1.0], [-1.0]]), num_images=1).tolist() == [1]


def test_fedsgd_fit_config_with_gradient_leakage_parses(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / "dlg_lenet_digits_fedsgd.yaml"), "--print_config"])
    assert exit_info.value.code == 0
    assert "class_path: lightning_fl.callbacks.GradientLeakage" in capsys.readouterr().out
