from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lightning_fl.cli import main

QUICKSTART = Path(__file__).parents[1] / "configs" / "quickstart.yaml"

# every command here runs where runs/quickstart and the other default run folders hold a finished run, as in a
# working tree after `make quickstart`: a command that reads or writes one it was not given fails its test
pytestmark = pytest.mark.usefixtures("cwd_with_finished_runs")


def test_fit_writes_summary_and_resolved_config(tmp_path, capsys) -> None:
    rc = main(
        [
            "fit",
            "--config",
            str(QUICKSTART),
            "--output_dir",
            str(tmp_path),
            "--loop.num_rounds",
            "2",
            "--data.image_size",
            "16",
            "--loop.progress_bar",
            "false",
        ]
    )
    assert rc == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and 0.0 < summary["test_accuracy"] <= 1.0
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["loop"]["num_rounds"] == 2 and saved["data"]["image_size"] == 16
    assert json.loads((tmp_path / "manifest.json").read_text())["round_idx"] == 2
    assert (tmp_path / "logs" / "metrics.csv").exists()


def test_fit_resume_continues_from_the_last_round(tmp_path) -> None:
    base = [
        "fit",
        "--config",
        str(QUICKSTART),
        "--output_dir",
        str(tmp_path),
        "--data.image_size",
        "16",
        "--loop.progress_bar",
        "false",
    ]
    assert main([*base, "--loop.num_rounds", "1"]) == 0
    assert main([*base, "--loop.num_rounds", "2", "--resume", "true"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [h["round"] for h in summary["history"]] == [0, 1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--loop.clients_per_round", "20"], "loop.clients_per_round=20 exceeds data.num_clients=10"),
        (["--loop.num_rounds", "-1"], "loop.num_rounds=-1 trains nothing; it must be >= 1"),
        (["--data.dataset", "no-such-data"], "data.dataset='no-such-data' is neither a known dataset"),
        (["--model.init_args.backbone", "resnet9000"], "model.backbone='resnet9000' is unknown"),
        (["--data.alpha", "0"], "data.alpha=0.0 must be a finite number > 0"),
        (["--loop.no_such_key", "1"], "unrecognized arguments: --loop.no_such_key"),
    ],
)
def test_bad_config_exits_with_one_line_naming_the_key(tmp_path, capsys, args: list[str], message: str) -> None:
    rc = main(["fit", "--config", str(QUICKSTART), "--output_dir", str(tmp_path), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "summary.json").exists()


def test_missing_data_path_is_a_config_error(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    args = ["--data.dataset", str(tmp_path / "missing"), "--output_dir", str(run)]
    rc = main(["fit", "--config", str(QUICKSTART), *args])
    assert rc == 2 and "nor an existing ImageFolder directory" in capsys.readouterr().err
    assert not run.exists()


def test_a_test_that_forgets_its_output_dir_meets_the_working_trees_finished_run(capsys) -> None:
    """The guard of this module: without --output_dir the quickstart config's runs/quickstart holds a run."""
    assert main(["fit", "--config", str(QUICKSTART), "--data.dataset", "digits"]) == 2
    assert "output_dir='runs/quickstart' holds a run" in capsys.readouterr().err


def test_print_config_shows_every_key_without_training(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(QUICKSTART), "--output_dir", str(tmp_path), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert exit_info.value.code == 0
    assert printed["loop"]["clients_per_round"] == 5 and printed["data"]["partition"] == "dirichlet"
    assert not (tmp_path / "summary.json").exists()


def test_fit_help_lists_the_toolkits_classes_not_every_library_dataset(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = capsys.readouterr().out
    assert len(text.splitlines()) < 400 and "DataPipe" not in text and "torchvision.datasets" not in text
    assert "lightning_fl.ImageTensorDataset" in text and "or any class_path)" in text
    assert "--overwrite" in text
