"""``lightning-fl bench`` on a 2 x 2 mini-grid: the table, the pictures, resuming, and a real defence effect."""

from __future__ import annotations

import csv
import json

import pytest
import torch
import yaml
from PIL import Image

from lightning_fl.attacks import DLGAttack
from lightning_fl.bench import cells, load_settings, run_bench
from lightning_fl.bench.cell import _result
from lightning_fl.callbacks import GradientLeakage
from lightning_fl.cli import main
from lightning_fl.messages import ServerView
from tests.wandb_offline import offline_run

_DLG = {"class_path": "lightning_fl.attacks.DLGAttack", "init_args": {"max_iterations": 60}}
_MINI = {
    "seeds": [0],
    "leak_points": ["local_gradient"],
    "attack_rounds": [0],
    "max_images": 1,
    "data": {"dataset": "digits", "num_clients": 4, "partition": "iid", "batch_size": 1, "image_size": 16},
    "model": {
        "class_path": "lightning_fl.models.ImageClassifier",
        "init_args": {"backbone": "lenet_dlg", "optimizer": "sgd", "lr": 0.05},
    },
    "loop": {"num_rounds": 1, "clients_per_round": 1, "local_steps": 2, "trainer": {"accelerator": "cpu"}},
    "attacks": {
        "dlg": _DLG,
        "ig": {"class_path": "lightning_fl.attacks.InvertingGradientsAttack", "init_args": {"max_iterations": 200}},
    },
    "defences": {
        "none": {},
        "fed_cdp": {"defences": [{"class_path": "lightning_fl.defences.FedCDP", "init_args": {"max_grad_norm": 4.0}}]},
    },
}


def test_mini_grid_writes_table_pictures_and_resumes(tmp_path) -> None:
    lines: list[str] = []
    rows = run_bench(_MINI, tmp_path, print_=lines.append)
    table = list(csv.DictReader((tmp_path / "bench.csv").open()))
    assert [(r["defence"], r["attack"]) for r in table] == [
        ("none", "dlg"),
        ("none", "ig"),
        ("fed_cdp", "dlg"),
        ("fed_cdp", "ig"),
    ]
    none, cdp = rows[1], rows[3]  # Inverting Gradients (Geiping et al., 2020)
    assert none["psnr_mean"] > 25.0 and none["label_accuracy_mean"] == 1.0 and none["epsilon_mean"] is None
    assert cdp["psnr_mean"] < 15.0 and cdp["epsilon_mean"] > 0  # per-example clipping + noise hides the image
    assert none["success_rate_mean"] == 1.0 and cdp["success_rate_mean"] == 0.0
    assert all(0.0 <= float(r["test_accuracy_mean"]) <= 1.0 for r in table)
    markdown = (tmp_path / "bench.md").read_text()
    assert "| fed_cdp | ig | local_gradient |" in markdown
    for name in ("scatter.png", "heatmap.png"):
        assert Image.open(tmp_path / name).format == "PNG"
    stored = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cells").glob("*.json")}
    assert len(stored) == 4 and (tmp_path / "runs" / "none__local_gradient__s0" / "curves.png").exists()
    assert "4 to run in 2 federated run(s)" in lines[0]  # one run per defence: both attacks are its callbacks
    assert any(line.startswith("bench: wall") and "CPU" in line for line in lines)

    lines.clear()
    run_bench(_MINI, tmp_path, print_=lines.append, wandb_project="bench")  # resumed: nothing re-runs
    assert "4 already done, 0 to run" in lines[0]
    (row,) = offline_run(tmp_path)["history"]
    assert row["bench/nrows"] == 4 and row["scatter/_type"] == row["heatmap/_type"] == "image-file"
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cells").glob("*.json")} == stored

    changed = {**_MINI, "attacks": {**_MINI["attacks"], "dlg": {**_DLG, "init_args": {"max_iterations": 61}}}}
    lines.clear()
    partial = run_bench(changed, tmp_path, print_=lines.append, report_only=True)  # the changed cells do not count
    assert "2 are missing" in lines[1] and [(r["defence"], r["attack"]) for r in partial] == [
        ("none", "ig"),
        ("fed_cdp", "ig"),
    ]
    assert "with 2 of 4 cells finished" in (tmp_path / "bench.md").read_text()
    lines.clear()
    run_bench(changed, tmp_path, print_=lines.append)  # changed settings: only those cells re-run
    assert "2 already done, 2 to run" in lines[0]
    again = {p.name: json.loads(p.read_text()) for p in (tmp_path / "cells").glob("*.json")}
    for defence in ("none", "fed_cdp"):  # the re-run without IG trains the same federation as the first run
        dlg, ig = again[f"{defence}__dlg__local_gradient__s0.json"], again[f"{defence}__ig__local_gradient__s0.json"]
        assert dlg["test_accuracy"] == ig["test_accuracy"]


def test_quick_preset_is_the_issue_grid() -> None:
    settings = load_settings("configs/bench_digits.yaml", quick=True)
    grid = cells(settings)
    assert len(settings["attacks"]) >= 5 and len(settings["defences"]) >= 10
    everywhere = [a for a in settings["attacks"] if "applies_to" not in settings["attacks"][a]]
    assert len(everywhere) >= 4
    inversion = [(c.defence, c.leak_point) for c in grid if c.attack == "colluding_mi"]  # only with private layers
    assert {d for d, _ in inversion} == {"fdl_pp_split", "fdl_pp_passports"} and len(inversion) == 4
    assert len(grid) == (len(everywhere) * len(settings["defences"]) + 2) * len(settings["leak_points"])
    assert settings["attacks"]["dlg"]["class_path"] == "lightning_fl.attacks.DLGAttack"  # merged, not replaced
    full = load_settings("configs/bench_digits.yaml")
    assert len(full["seeds"]) >= 3 and full["loop"]["num_rounds"] > settings["loop"]["num_rounds"]
    assert full["attacks"]["grnn"]["init_args"]["iterations"] > settings["attacks"]["grnn"]["init_args"]["iterations"]


def test_bench_rejects_a_bad_config_before_writing(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**_MINI, "only": {"attacks": ["dlgg"]}, "output_dir": str(tmp_path / "out")}))
    assert main(["bench", "-c", str(bad)]) == 2
    scoped = {**_MINI, "attacks": {"dlg": {**_DLG, "applies_to": ["nonee"]}}, "output_dir": str(tmp_path / "out")}
    bad.write_text(yaml.safe_dump(scoped))
    assert main(["bench", "-c", str(bad)]) == 2
    assert "attacks.dlg.applies_to names ['nonee']" in capsys.readouterr().err
    assert main(["bench", "-c", "configs/bench_digits.yaml", "--jobs", "0"]) == 2
    assert not (tmp_path / "out").exists()


class _RecordingLoop:
    round_idx = 0

    def __init__(self) -> None:
        self.attacks: list[dict] = []

    def record_attack(self, entry: dict) -> None:
        self.attacks.append(entry)


def test_a_ciphertext_view_counts_as_unreadable_not_as_a_failure() -> None:
    leakage = GradientLeakage(DLGAttack(max_iterations=1), leak_point="client_update")
    view = ServerView("client_update", torch.nn.Linear(1, 1), {}, "update", {"client_id": 0})
    loop = _RecordingLoop()
    leakage.on_client_update(loop, view, None)  # an attack on it would raise: nothing is intercepted
    assert [a["readable"] for a in loop.attacks] == [False]
    summary = {"attacks": loop.attacks, "history": [], "test_accuracy": 0.9}
    result = _result({"success_ssim": 0.6}, summary, 1.0)
    assert result["unreadable"] == 1 and result["attacked"] == 0 and result["success_rate"] == 0.0


@pytest.mark.slow
def test_cells_run_in_worker_processes(tmp_path) -> None:
    run_bench({**_MINI, "attacks": {"dlg": _DLG}}, tmp_path, jobs=2)
    cell = json.loads((tmp_path / "cells" / "fed_cdp__dlg__local_gradient__s0.json").read_text())
    assert cell["status"] == "ok" and cell["epsilon"] > 0


def test_a_failing_attack_fails_its_own_cell_not_the_run_it_shares(tmp_path) -> None:
    inversion = {"class_path": "lightning_fl.attacks.ColludingClientInversion", "init_args": {"iterations": 5}}
    settings = {**_MINI, "defences": {"none": {}}, "attacks": {"mi": inversion, "dlg": _DLG}}
    lines: list[str] = []
    run_bench(settings, tmp_path, print_=lines.append)  # no private layers: the inversion has no cut to invert
    assert "2 to run in 1 federated run(s)" in lines[0]
    status = {line.split(":")[0].strip(): line for line in lines[1:3]}
    assert "failed: ValueError" in status["none__mi__local_gradient__s0"] and "no private module" in "".join(lines)
    assert status["none__dlg__local_gradient__s0"].split(": ")[1].startswith("ok")
    assert [p.name for p in (tmp_path / "cells").glob("*.json")] == ["none__dlg__local_gradient__s0.json"]
