"""Per-run pictures and W&B as its users expect: resolved config, ``round`` as the x-axis, one row per round."""

from __future__ import annotations

import warnings

from PIL import Image

from lightning_fl.attacks import DLGAttack
from lightning_fl.callbacks import GradientLeakage
from lightning_fl.cli import main
from lightning_fl.federation import FederatedLoop
from lightning_fl.federation.plots import plot_curves
from tests.conftest import make_classifier
from tests.wandb_offline import offline_run

_SMALL = ["--loop.num_rounds", "2", "--data.num_clients", "4", "--loop.clients_per_round", "2"]


def test_quickstart_fit_logs_resolved_config_round_axis_and_curves(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    argv = ["fit", "-c", "configs/quickstart.yaml", *_SMALL, "--loop.local_epochs", "1", "--loop.progress_bar", "false"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*argv, "--output_dir", str(tmp_path), "--loop.wandb_project", "X"]) == 0
    assert "deprecat" not in capsys.readouterr().err.lower()  # the command prints no deprecation warnings
    assert not [w for w in caught if issubclass(w.category, DeprecationWarning) and "jsonargparse" in w.filename]
    run = offline_run(tmp_path)
    assert run["config"]["model"]["init_args"]["lr"] == 0.002  # from the YAML
    assert run["config"]["loop"]["num_rounds"] == 2  # from the command line
    assert run["config"]["data"]["num_clients"] == 4 and run["config"]["seed_everything"] == 0
    assert run["metrics"]["*"] == "round" and "round" in run["metrics"]
    assert [row["round"] for row in run["history"]] == [0, 1]  # one row per round, not per log call
    assert all(0.0 <= row["test_accuracy"] <= 1.0 for row in run["history"])
    assert "curves/filenames" in run["history"][-1]
    curves = Image.open(tmp_path / "curves.png")
    assert curves.format == "PNG" and curves.size == (800, 320)  # accuracy and loss panels; no ε here


def test_attack_scores_and_images_share_the_round_row(tiny_digits, tmp_path) -> None:
    attack = GradientLeakage(
        DLGAttack(max_iterations=3, progress_bar=False), leak_point="local_gradient", rounds=[1], max_images=64
    )
    options = dict(num_rounds=2, clients_per_round=1, local_steps=1, progress_bar=False, output_dir=tmp_path)
    loop = FederatedLoop(make_classifier(tiny_digits), tiny_digits, callbacks=[attack], wandb_project="t", **options)
    loop.fit()
    rows = offline_run(tmp_path)["history"]
    assert [row["round"] for row in rows] == [0, 1]
    assert not any(k.startswith("attack/") for k in rows[0])
    (psnr,) = [k for k in rows[1] if k.startswith("attack/dlg/local_gradient/") and k.endswith("/psnr")]
    assert rows[1][psnr] == loop.recorder.attacks[0]["psnr"] and "test_accuracy" in rows[1]
    assert any(k.startswith("attacks/dlg_local_gradient_r1") and k.endswith("/filenames") for k in rows[1])
    assert rows[1]["attack_table/nrows"] == 1


def test_curves_have_an_epsilon_panel_when_the_run_spends_privacy(tmp_path) -> None:
    history = [{"round": r, "test_accuracy": 0.1 * r, "train_loss": 2.0 - r, "epsilon": 0.5 * r} for r in range(3)]
    assert Image.open(plot_curves(history, tmp_path / "curves.png")).size == (1200, 320)
    assert plot_curves([{"round": 0, "clients": [1]}], tmp_path / "none.png") is None
