"""run_attack and the `lightning-fl attack` command: one attack on one batch, summary.json and the grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightning_fl.attacks import (
    GRNN,
    ColludingClientInversion,
    DLGAttack,
    IDLGAttack,
    InvertingGradientsAttack,
    MIFace,
    infer_labels,
)
from lightning_fl.attacks.base import GradientAttack
from lightning_fl.attacks.standalone import AttackRun, client_view, run_attack, view_on
from lightning_fl.cli import main
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.messages import ServerView
from lightning_fl.private import mark_private
from tests.attacks.views import digits_view
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
        run=AttackRun(batch_size=2),
        output_dir=tmp_path,
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["attacks"] == [entry] and set(entry) >= ENTRY_KEYS
    assert entry["num_images"] == 2 and Path(entry["image"]).is_file()


def test_run_attack_takes_its_batch_from_a_user_datamodule(tmp_path: Path) -> None:
    from tests.user_project import DigitsDataModule, DigitsNet

    dm = FederatedDataModule(DigitsDataModule(batch_size=8), num_clients=2, partition="iid")
    torch.manual_seed(0)
    attack = DLGAttack(max_iterations=5, progress_bar=False)
    entry = run_attack(attack, data=dm, model=DigitsNet(), run=AttackRun(batch_size=2), output_dir=tmp_path)
    assert entry["num_images"] == 2 and len(entry["attacked"]) == 2
    assert all(name.startswith("client 0 image ") for name in entry["attacked"])
    assert 0 <= entry["label_accuracy"] <= 1 and Path(entry["image"]).is_file()


def test_client_view_shares_only_public_tensors_and_metadata() -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16)
    images, labels = dm.sample_batch(0, 4, seed=0)
    view = client_view(make_classifier(dm), images, labels, num_classes=10, local_steps=2, lr=0.1)
    assert view.kind == "update" and view.metadata["batch_size"] == 2 and view.metadata["local_steps"] == 2
    flat = torch.cat([t.flatten() for t in view.tensors.values()])
    assert not torch.isin(images.flatten(), flat).all()
    with pytest.raises(ValueError, match="multiple of local_steps=3"):
        client_view(make_classifier(dm), images, labels, num_classes=10, local_steps=3)


def test_attack_command_attacks_a_folder_of_one_photo_per_class_and_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from torchvision.utils import save_image

    from lightning_fl.datamodules.datasets import load_dataset

    photos = load_dataset("photos", train=True, image_size=32)
    for k in (10, 30, 50):
        folder = tmp_path / "mine" / photos.sources[k].split(":")[1].split("[")[0]
        folder.mkdir(parents=True)
        save_image(photos.images[k], folder / f"{k}.png")
    args = ["attack", "--config", str(CONFIGS / "dlg_lenet_digits.yaml"), "--data.dataset", str(tmp_path / "mine")]
    args += ["--data.num_clients", "1", "--attack.init_args.max_iterations", "3", "--output_dir", str(tmp_path / "o")]
    assert main([*args, "--attack.init_args.progress_bar", "false"]) == 0
    entry = json.loads((tmp_path / "o" / "summary.json").read_text())["attacks"][0]
    assert Path(entry["attacked"][0]).is_file() and Path(entry["attacked"][0]).parent.parent == tmp_path / "mine"
    assert Path(entry["image"]).is_file()
    assert f"attacked: {entry['attacked'][0]}" in capsys.readouterr().out


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


def test_run_attack_on_an_explicit_device_matches_the_default(tmp_path: Path) -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16)
    entries = []
    for device in (None, "cpu"):
        torch.manual_seed(0)
        run = AttackRun() if device is None else AttackRun(device=device)
        attack = IDLGAttack(max_iterations=5, progress_bar=False)
        entries.append(run_attack(attack, data=dm, model=make_classifier(dm), run=run, output_dir=tmp_path))
    assert entries[0]["mse"] == entries[1]["mse"] and entries[0]["psnr"] > 0


def _double(view: ServerView) -> ServerView:
    tensors = {name: tensor.double() for name, tensor in view.tensors.items()}
    return ServerView(view.leak_point, view.model.double(), tensors, view.kind, view.metadata)


@pytest.mark.parametrize(
    "attack",
    [
        DLGAttack(max_iterations=3, restarts=2, progress_bar=False),
        InvertingGradientsAttack(max_iterations=3, restarts=2, progress_bar=False),
        GRNN(iterations=3, latent_dim=8, width=4, progress_bar=False),
        MIFace(target_classes=[1, 2], iterations=3, progress_bar=False),
        ColludingClientInversion(
            feature_attack=DLGAttack(max_iterations=3, init="rand", progress_bar=False),
            iterations=3,
            progress_bar=False,
        ),
    ],
    ids=lambda attack: attack.name,
)
def test_attacks_run_in_the_attacked_models_dtype_from_the_same_start(attack: GradientAttack) -> None:
    """Device plumbing without a GPU: a float64 model makes every attack tensor float64 (as a CUDA model makes
    them CUDA tensors), and the CPU-drawn start is the same, so the first objective matches the float32 run."""
    view, _ = digits_view(image_size=8 if attack.name == "mi_face" else 16)
    if attack.name == "colluding_mi":  # FDL-PP's split: the first convolution and its activation are private
        mark_private(view.model.backbone.body[0])
        mark_private(view.model.backbone.body[1])
    single = attack.reconstruct(view)
    double = attack.reconstruct(_double(view_on(view, torch.device("cpu"))))
    assert double.images.dtype == torch.float64 and double.images.device.type == "cpu"
    assert double.loss_history[0] == pytest.approx(single.loss_history[0], rel=1e-4)
    assert double.images.to(torch.float32).sub(single.images).abs().max() < 1e-2


def test_attack_command_takes_the_device(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["attack", "--config", str(CONFIGS / "dlg_lenet_digits.yaml"), "--run.device", "cpu", "--print_config"])
    assert exit_info.value.code == 0 and "device: cpu" in capsys.readouterr().out
