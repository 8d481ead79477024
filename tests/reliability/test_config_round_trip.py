"""A saved config reproduces its run: ``fit -c <run>/config.yaml --output_dir <new>`` gives the same history, for
every kind of data source (a dataset name, an ImageFolder, a ``Dataset`` class path, a user's
``LightningDataModule`` class path), and so does the text ``--print_config`` prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from lightning_fl.cli import main
from tests.user_project import digits_tensors

USER_MODEL = ["--model", "tests.user_project.DigitsNet"]
OUR_MODEL = ["--model", "lightning_fl.models.ImageClassifier", "--model.init_args.backbone", "lenet5"]


def _image_folder(root: Path) -> Path:
    """Three classes of 12 real digits each, as 8x8 PNG files in ImageFolder layout."""
    images, labels = digits_tensors()
    for label in range(3):
        (root / f"class_{label}").mkdir(parents=True)
        for i, image in enumerate(images[labels == label][:12]):
            pixels = (image[0] * 255).byte().numpy()
            Image.fromarray(pixels, mode="L").save(root / f"class_{label}" / f"{i}.png")
    return root


def _sources(tmp_path: Path) -> dict[str, list[str]]:
    split = "{class_path: tests.user_project.DigitsSplit, init_args: {train: false}}"
    return {
        "name": ["--data.dataset", "digits", "--data.image_size", "16", *OUR_MODEL],
        "image folder": [
            "--data.dataset",
            str(_image_folder(tmp_path / "folder")),
            "--data.image_size",
            "16",
            *OUR_MODEL,
        ],
        "dataset class": [
            "--data.dataset",
            "tests.user_project.DigitsSplit",
            "--data.test_dataset",
            split,
            *USER_MODEL,
        ],
        "datamodule class": [
            "--data.dataset",
            "{class_path: tests.user_project.DigitsDataModule, init_args: {batch_size: 16}}",
            *USER_MODEL,
        ],
    }


COMMON = ["--data.num_clients", "2", "--data.partition", "iid", "--loop.num_rounds", "2", "--loop.local_steps", "3"]
COMMON += ["--loop.progress_bar", "false", "--seed_everything", "1"]


def _fit(output_dir: Path, *args: str) -> list[dict]:
    assert main(["fit", *args, "--output_dir", str(output_dir)]) == 0
    return json.loads((output_dir / "summary.json").read_text())["history"]


@pytest.mark.parametrize("kind", ["name", "image folder", "dataset class", "datamodule class"])
def test_the_saved_config_reproduces_the_run(tmp_path, kind: str) -> None:
    history = _fit(tmp_path / "first", *_sources(tmp_path)[kind], *COMMON)
    assert _fit(tmp_path / "again", "-c", str(tmp_path / "first" / "config.yaml")) == history
    assert len(history) == 2 and history[-1]["test_accuracy"] is not None


def test_the_printed_config_reproduces_the_run(tmp_path, capsys) -> None:
    args = [*_sources(tmp_path)["datamodule class"], *COMMON]
    history = _fit(tmp_path / "first", *args)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["fit", *args, "--print_config"])
    printed = tmp_path / "printed.yaml"
    printed.write_text(capsys.readouterr().out)
    assert "Namespace(" not in printed.read_text()
    assert _fit(tmp_path / "printed", "-c", str(printed)) == history
