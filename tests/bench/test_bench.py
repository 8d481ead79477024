"""``lightning-fl bench`` on a mini-grid: utility runs, threat models, the table, resuming and a real defence effect."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

from lightning_fl.attacks import DLGAttack
from lightning_fl.bench import Utility, cells, load_settings, run_bench, utilities
from lightning_fl.bench.cell import _scores, run_utility
from lightning_fl.bench.grid import FIXED_BATCHES, family
from lightning_fl.callbacks import GradientLeakage
from lightning_fl.cli import main
from lightning_fl.code_fingerprint import code_fingerprint
from lightning_fl.datamodules.datasets import load_dataset
from lightning_fl.messages import ServerView

_IG = {"class_path": "lightning_fl.attacks.InvertingGradientsAttack", "init_args": {"max_iterations": 200}}
_B1 = {"leak_point": "local_gradient", "data": {"batch_size": 1}}
MINI = {
    "seeds": [0],
    "data": {"dataset": "digits", "num_clients": 4, "partition": "iid", "batch_size": 16, "image_size": 16},
    "model": {
        "class_path": "lightning_fl.models.ImageClassifier",
        "init_args": {"backbone": "lenet_dlg", "optimizer": "adam", "lr": 0.002},
    },
    "loop": {"num_rounds": 2, "clients_per_round": 2, "local_steps": 4, "trainer": {"accelerator": "cpu"}},
    "attack_run": {
        "model": {"init_args": {"optimizer": "sgd", "lr": 0.05}},
        "loop": {"num_rounds": 1, "clients_per_round": 1, "local_steps": 1, "eval_every": 0},
    },
    "threat_models": {"fedsgd_b1": _B1, "fedsgd_b1_trained": {**_B1, "trained": True}},
    "attacks": {"ig": _IG},
    "defences": {
        "none": {},
        "fed_cdp": {"defences": [{"class_path": "lightning_fl.defences.FedCDP", "init_args": {"max_grad_norm": 4.0}}]},
    },
}


def test_mini_grid_reports_utility_per_defence_and_a_threat_model_column_and_resumes(tmp_path) -> None:
    lines: list[str] = []
    rows = run_bench(MINI, tmp_path, print_=lines.append)
    assert "2 of 2 utility run(s) and 4 of 4 attack cells" in lines[0]
    table = list(csv.DictReader((tmp_path / "bench.csv").open()))
    assert [(r["defence"], r["threat_model"], r["leak_point"]) for r in table] == [
        ("none", "fedsgd_b1", "local_gradient"),
        ("none", "fedsgd_b1_trained", "local_gradient"),
        ("fed_cdp", "fedsgd_b1", "local_gradient"),
        ("fed_cdp", "fedsgd_b1_trained", "local_gradient"),
    ]
    for defence in ("none", "fed_cdp"):  # every attack row of a defence reports its utility run
        stored = json.loads((tmp_path / "utility" / f"{defence}__s0.json").read_text())
        assert {float(r["test_accuracy_mean"]) for r in table if r["defence"] == defence} == {stored["test_accuracy"]}
        assert {int(r["utility_rounds"]) for r in table if r["defence"] == defence} == {2}
    none, none_trained, cdp, _ = rows  # Inverting Gradients (Geiping et al., 2020) at one image
    assert none["psnr_mean"] > 25.0 and none["epsilon_mean"] is None and none["success_rate_mean"] == 1.0
    assert none_trained["psnr_mean"] > 20.0  # the trained model still leaks the image
    assert cdp["psnr_mean"] < 15.0 and cdp["epsilon_mean"] > 0 and cdp["success_rate_mean"] == 0.0
    assert (tmp_path / "runs" / "utility" / "none__s0" / "global_model.safetensors").exists()
    markdown = (tmp_path / "bench.md").read_text()
    assert "Threat model `fedsgd_b1_trained` (leak point local_gradient)" in markdown
    assert any(line.startswith("bench: wall") and "CPU" in line for line in lines)
    # one line per finished run, counting up to the number of runs: with one job the trained-model attack runs ran
    # twice (when their model was written, then with the other attack runs), and the count read "8 of 6"
    progress = [line for line in lines if " runs done, " in line]
    assert [line.split(" of ")[0] for line in progress] == [f"bench: {n}" for n in range(1, len(progress) + 1)]
    assert progress[-1].startswith(f"bench: {len(progress)} of {len(progress)} runs done") and len(progress) >= 4

    lines.clear()
    run_bench(MINI, tmp_path, print_=lines.append)  # resumed: nothing re-runs
    assert "0 of 2 utility run(s) and 0 of 4 attack cells" in lines[0]
    stale = tmp_path / "cells" / "none__ig__fedsgd_b1__s0.json"  # made before its attack's code changed
    stale.write_text(json.dumps({**json.loads(stale.read_text()), "code": "an earlier attack"}))
    lines.clear()
    run_bench(MINI, tmp_path, print_=lines.append, report_only=True)  # drawn as stored, and said
    assert "the 4 finished cells (1 made by other lightning-fl code" in lines[1] and "0 are missing" in lines[1]
    lines.clear()
    run_bench(MINI, tmp_path, print_=lines.append)  # measured anew by this code
    assert "0 of 2 utility run(s) and 1 of 4 attack cells" in lines[0]
    assert json.loads(stale.read_text())["code"] == code_fingerprint()
    longer = {**MINI, "loop": {**MINI["loop"], "num_rounds": 3}}  # a new utility setting re-runs the trained cells
    lines.clear()
    partial = run_bench(longer, tmp_path, print_=lines.append, report_only=True)
    assert "2 are missing" in lines[1] and [r["threat_model"] for r in partial] == ["fedsgd_b1", "fedsgd_b1"]


def test_the_none_utility_run_equals_lightning_fl_fit_of_the_same_settings(tmp_path) -> None:
    settings = {**MINI, "data": {**MINI["data"], "partition": "dirichlet", "alpha": 0.5}}
    spec = Utility("none", 0).spec(settings)
    bench = run_utility(spec, tmp_path / "bench")
    config = {key: settings[key] for key in ("data", "model", "loop")}
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump({**config, "seed_everything": 0}))
    assert main(["fit", "-c", str(tmp_path / "fit.yaml"), "--output_dir", str(tmp_path / "fit")]) == 0
    fit = json.loads((tmp_path / "fit" / "summary.json").read_text())
    assert bench["test_accuracy"] == fit["test_accuracy"] and bench["rounds"] == fit["rounds_completed"] == 2


def test_quick_preset_has_threat_models_with_a_batch_and_the_quickstart_utility_setting() -> None:
    settings = load_settings("configs/bench_digits.yaml", quick=True)
    quickstart = yaml.safe_load(Path("configs/quickstart.yaml").read_text())
    for key in ("num_rounds", "clients_per_round", "local_epochs"):
        assert settings["loop"][key] == quickstart["loop"][key]
    assert settings["data"]["batch_size"] == quickstart["data"]["batch_size"] == 32
    threats = settings["threat_models"]
    assert len(threats) >= 3 and max(t.get("data", {}).get("batch_size", 32) for t in threats.values()) >= 8
    fedsgd = {name: t for name, t in threats.items() if name.startswith("fedsgd")}
    assert len(fedsgd) >= 3 and {t["leak_point"] for t in fedsgd.values()} == {"client_update"}  # the server's view
    assert any(t.get("trained") for t in threats.values())
    full_threats = load_settings("configs/bench_digits.yaml")["threat_models"]
    assert set(threats) < set(full_threats)  # the quick grid is a part of the full one's threat models
    assert [t["leak_point"] for t in full_threats.values()].count("local_gradient") == 1  # one type-2 row, full
    grid = cells(settings)
    inversion = {(c.defence, c.threat_model) for c in grid if c.attack == "colluding_mi"}  # only private layers
    assert {family(settings, d) for d, _ in inversion} == {"fdl_pp_split", "fdl_pp_passports"}
    assert len(utilities(settings)) == len(settings["defences"])
    full = load_settings("configs/bench_digits.yaml")
    assert len(full["seeds"]) >= 3 and full["loop"] == settings["loop"]  # the same utility runs, more seeds
    budget = "max_iterations"
    assert full["attacks"]["ig"]["init_args"][budget] > settings["attacks"]["ig"]["init_args"][budget]


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
    result = _scores({"success_ssim": 0.6}, loop.attacks, 1.0)
    assert result["unreadable"] == 1 and result["attacked"] == 0 and result["success_rate"] == 0.0


def test_photos_preset_is_rgb_at_32_with_the_same_threat_model_kinds() -> None:
    settings = load_settings("configs/bench_photos.yaml", quick=True)
    assert (settings["data"]["dataset"], settings["data"]["image_size"]) == ("photo_tiles", 32)
    test_set = load_dataset(settings["data"]["dataset"], train=False, image_size=32)  # a test set that can rank
    assert len(test_set) >= 60 and set(test_set.labels.bincount().tolist()) == {7}  # 7 tiles of each photograph
    assert settings["model"]["init_args"]["backbone"] == "lenet_dlg"  # a conv net (DLG's sigmoid LeNet)
    threats = settings["threat_models"]
    assert {t["leak_point"] for t in threats.values()} == {"client_update", "aggregate"}  # FedSGD, FedAvg, their sum
    assert any(t.get("trained") for t in threats.values()) and len(threats) >= 3


def test_fl_and_dp_algorithms_are_grid_entries(tmp_path) -> None:
    """FedAdam (an aggregator), FedProx (a client callback), DP-FedAvg and SecAgg (defence bundles) as bench rows;
    the attack runs take two clients a round (secure aggregation of one client is refused: it hides nothing)."""
    attack_run = {**MINI["attack_run"], "loop": {**MINI["attack_run"]["loop"], "clients_per_round": 2}}
    grid = {**MINI, "attack_run": attack_run, "threat_models": {"fedsgd_b1": _B1}}
    grid["defences"] = {
        "fedadam": {"loop": {"aggregator": {"class_path": "lightning_fl.FedAdam"}}},
        "fedprox": {"client_callbacks": [{"class_path": "lightning_fl.FedProx", "init_args": {"mu": 0.01}}]},
        "dp_fedavg": {
            "defences": [{"class_path": "lightning_fl.defences.DPFedAvg", "init_args": {"clipped_count_stddev": 1.0}}]
        },
        "secagg": {"defences": [{"class_path": "lightning_fl.defences.SecAggMasking"}]},
    }
    rows = {r["defence"]: r for r in run_bench(grid, tmp_path, print_=lambda _: None)}
    assert all(r["status"] == "ok" for r in rows.values()), {d: r["status"] for d, r in rows.items()}
    assert rows["dp_fedavg"]["epsilon_mean"] > 0 and rows["fedadam"]["epsilon_mean"] is None


def test_dp_attack_runs_fix_the_threat_models_batch_while_utility_runs_keep_poisson_sampling(tmp_path) -> None:
    """A threat model says "B images": DP-SGD's Poisson batches hold B only on average, so the attack run draws
    fixed batches of B, while the utility run (and the ε it reports) keeps the defence's Poisson sampling."""
    dual = {"class_path": "lightning_fl.defences.DualDPFL", "init_args": {"target_epsilon": 8.0}}
    grid = {
        **MINI,
        "threat_models": {"fedsgd_b8": {"leak_point": "local_gradient", "data": {"batch_size": 8}, "max_images": 8}},
        "attacks": {"dlg": {"class_path": "lightning_fl.attacks.DLGAttack", "init_args": {"max_iterations": 2}}},
        "defences": {"fed_cdp": MINI["defences"]["fed_cdp"], "dual_dp": {"defences": [dual]}},
    }
    assert "sampling" not in Utility("dual_dp", 0).spec(grid)["defences"][0]["init_args"]
    fixed = {**dual, "init_args": {**dual["init_args"], "sampling": FIXED_BATCHES}}
    assert cells(grid)[1].spec(grid)["defences"] == [fixed]
    rows = {r["defence"]: r for r in run_bench(grid, tmp_path, print_=lambda _: None)}
    for defence, component in (("fed_cdp", "FedCDP"), ("dual_dp", "DualDP")):
        assert rows[defence]["status"] == "ok", rows[defence]["status"]  # attacked: one client, its first step
        utility = json.loads((tmp_path / "runs" / "utility" / f"{defence}__s0" / "summary.json").read_text())
        attack = json.loads((tmp_path / "runs" / f"{defence}__fedsgd_b8__s0" / "summary.json").read_text())
        assert utility["privacy"][component]["sampling"] == "poisson" and rows[defence]["epsilon_mean"] > 0
        assert attack["privacy"][component]["sampling"] == FIXED_BATCHES
        assert [a["ground_truth_size"] for a in attack["attacks"]] == [8]


def test_the_prior_only_baseline_is_a_row_that_reads_no_images_and_scores_at_guessing_level(tmp_path) -> None:
    """The calibration row (issue 30, item 4): guesses from the test split, read against a real attack."""
    prior = {"class_path": "lightning_fl.attacks.PriorBaseline"}
    grid = {
        **MINI,
        "attack_run": {**MINI["attack_run"], "loop": {**MINI["attack_run"]["loop"], "clients_per_round": 2}},
        "threat_models": {"fedsgd_b1": _B1},
        "attacks": {
            "ig": _IG,
            "prior_mean": {**prior, "init_args": {"guess": "mean"}},
            "prior_class": {**prior, "init_args": {"guess": "class_sample"}},
        },
        "defences": {"none": {}},
    }
    rows = {r["attack"]: r for r in run_bench(grid, tmp_path, print_=lambda _: None)}
    assert all(r["status"] == "ok" and r["images"] == 2 for r in rows.values()), rows
    assert [a for a, r in rows.items() if r["prior_only"]] == ["prior_mean", "prior_class"]
    cell = json.loads((tmp_path / "cells" / "none__prior_class__fedsgd_b1__s0.json").read_text())
    for name in ("prior_mean", "prior_class"):  # guessing: never a copy, far below the attack that reads the update
        scores = rows[name]
        assert scores["psnr_high"] < 20.0 and scores["psnr_capped"] == 0 and scores["ssim_high"] < 0.9
        assert scores["psnr_mean"] < rows["ig"]["psnr_mean"] - 8.0
    assert rows["prior_class"]["label_accuracy_mean"] == 1.0 and rows["prior_mean"]["label_accuracy_mean"] is None
    assert len(cell["images"]["ssim"]) == 2  # per-image scores, what the intervals resample
    # an attack's image counts as recovered only above every guess of the same image; a guess has no such reference
    cells = {n: json.loads((tmp_path / "cells" / f"none__{n}__fedsgd_b1__s0.json").read_text()) for n in rows}
    guesses = [cells[n]["images"]["ssim"] for n in ("prior_mean", "prior_class")]
    best_guess = [max(pair) for pair in zip(*guesses, strict=True)]
    assert cells["ig"]["images"]["guess_ssim"] == best_guess and "guess_ssim" not in cell["images"]
    ig_images = cells["ig"]["images"]
    expected = [float(v >= 0.5 and v > g) for v, g in zip(ig_images["ssim"], best_guess, strict=True)]
    assert cells["ig"]["success_rate"] == sum(expected) / len(expected)
    markdown = (tmp_path / "bench.md").read_text()
    assert "| none | prior_class (prior only) |" in markdown and "Guessing from public data" in markdown
    recovered = "share of images recovered: SSIM ≥ 0.5, beyond colour and guess"
    assert f"The undefended model is broken here ({recovered}): ig (1.00)" in markdown
    guessing_passes = max(rows[n]["success_rate_mean"] for n in ("prior_mean", "prior_class")) > 0
    assert guessing_passes == ("does not tell an attack from a guess" in markdown)  # said whenever it happens


def test_a_one_job_bench_stopped_midway_keeps_the_runs_it_finished(tmp_path, monkeypatch) -> None:
    from lightning_fl.bench import runner

    fake = {"status": "ok", "test_accuracy": 0.5, "epsilon": None, "rounds": 2, "cpu_seconds": 0.0}
    calls: list[str] = []

    def run(kind: str, payload, output_dir: str, trained=None):  # the utility run, then a stop (Ctrl+C)
        calls.append(kind)
        if kind == "attack":
            raise KeyboardInterrupt
        return fake

    monkeypatch.setattr(runner, "_run", run)
    grid = {**MINI, "defences": {"none": {}}, "threat_models": {"fedsgd_b1": _B1}}
    with pytest.raises(KeyboardInterrupt):
        run_bench(grid, tmp_path, jobs=1, print_=lambda _: None)
    assert calls == ["utility", "attack"]
    assert json.loads((tmp_path / "utility" / "none__s0.json").read_text())["test_accuracy"] == 0.5  # kept: resumes
