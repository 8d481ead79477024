"""One entry of a list on the command line (``--defences.0.init_args.x``), and presets that measure the data's
statistics when a config does not give them (issue 33)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from torchvision.utils import save_image

from lightning_fl.attacks import MaliciousImprint
from lightning_fl.cli import main
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.models import ImageClassifier
from lightning_fl.transforms import apply_server_plugins

CONFIGS = Path(__file__).parents[1] / "configs"
PHOTOS = str(CONFIGS / "robbing_the_fed_photos.yaml")

pytestmark = pytest.mark.usefixtures("cwd_with_finished_runs")


def _printed(capsys: pytest.CaptureFixture, *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["attack", "--config", PHOTOS, *args, "--print_config"])
    assert exit_info.value.code == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_an_index_changes_one_entry_of_a_list_and_keeps_the_others(capsys: pytest.CaptureFixture) -> None:
    noise = ["--defences+", "lightning_fl.defences.GaussianNoise", "--defences.init_args.noise_std", "0.01"]
    pruning = ["--defences+", "lightning_fl.defences.GradientPruning", "--defences.init_args.ratio", "0.5"]
    before = _printed(capsys, *noise, *pruning)
    after = _printed(capsys, *noise, *pruning, "--defences.0.init_args.noise_std", "0.2")
    assert after["defences"][0]["init_args"]["noise_std"] == 0.2 and after["defences"][1] == before["defences"][1]
    imprint = _printed(capsys, "--server_plugins.0.init_args.feature_mean", "0.43")["server_plugins"][0]["init_args"]
    assert imprint["feature_mean"] == 0.43 and imprint["num_bins"] == 1024


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--server_plugins.3.init_args.gain", "2"], "server_plugins has 1 entries (indices 0-0)"),
        (["--server_plugins.0.init_args.num_bins", "many"], "num_bins"),
        (["--run.0.batch_size", "2"], "run is not a list in this config"),
    ],
)
def test_a_bad_index_exits_2_with_one_line(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    rc = main(["attack", "--config", PHOTOS, "--output_dir", str(tmp_path / "run"), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def _folder(root: Path) -> Path:
    """Three classes of four dark 16x16 RGB images (a brightness far from ``photo_tiles``' 0.40)."""
    for k in range(3):
        (root / f"c{k}").mkdir(parents=True)
        for i in range(4):
            save_image(torch.full((3, 16, 16), 0.05 + 0.01 * (4 * k + i)), root / f"c{k}" / f"{i}.png")
    return root


def test_an_imprint_without_statistics_measures_them_on_the_datas_held_out_split(tmp_path: Path) -> None:
    data = FederatedDataModule(str(_folder(tmp_path)), num_clients=1, partition="iid", image_size=16)
    data.setup()
    imprint = MaliciousImprint(num_bins=8)
    apply_server_plugins(ImageClassifier("lenet_dlg", **data.model_options), [imprint], data=data)
    held_out = torch.stack([x for x, _ in data.test_set]).mean(dim=(1, 2, 3))
    assert imprint.feature_mean == pytest.approx(float(held_out.mean()), abs=1e-6) and imprint.feature_mean < 0.15
    assert imprint.feature_std == pytest.approx(float(held_out.std()), abs=1e-6)
    with pytest.raises(ValueError, match="no feature_mean/feature_std: give both, or call use_data"):
        apply_server_plugins(ImageClassifier("lenet_dlg", **data.model_options), [MaliciousImprint(num_bins=8)])


def test_the_photo_imprint_config_on_another_folder_uses_that_folders_statistics(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["--data.dataset", str(_folder(tmp_path / "data")), "--run.batch_size", "4"]
    rc = main(
        ["attack", "--config", PHOTOS, *args, "--server_plugins.0.init_args.num_bins", "64", "--output_dir", str(run)]
    )
    assert rc == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["server_plugins"][0]["init_args"]["num_bins"] == 64
    scores = json.loads((run / "summary.json").read_text())["attacks"][0]
    # bins placed over this folder's brightness separate its 4 images (photo_tiles' statistics return 3 of them)
    assert scores["num_images"] == scores["recovered"] == 4
