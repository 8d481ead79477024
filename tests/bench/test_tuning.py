"""A defence's settings tuned per strength on the validation split before its utility run (issue 31, item 2)."""

from __future__ import annotations

import json

import pytest

from lightning_fl.bench import Utility, cell, load_settings, run_bench
from lightning_fl.bench.experiment import fit_loop
from lightning_fl.bench.tuning import combinations
from tests.bench.test_strength_axis import TINY


def test_a_tuned_defence_trains_with_the_setting_that_scores_best_on_the_validation_split(
    tmp_path, monkeypatch
) -> None:
    tune = {"grid": {"model.init_args.lr": [1e-9, 0.01]}, "loop": {"local_steps": 6}}
    grid = {**TINY, "defences": {"none": {"tune": tune}}}
    grid["attacks"] = {"dlg": {**TINY["attacks"]["dlg"], "init_args": {"max_iterations": 2}}}
    assert Utility("none", 0).spec(grid)["tune"] == tune
    trained: list[dict] = []  # the spec the utility run itself trains

    def recording_fit_loop(spec, output_dir):
        trained.append(spec)
        return fit_loop(spec, output_dir)

    monkeypatch.setattr(cell, "fit_loop", recording_fit_loop)
    run_bench(grid, tmp_path, print_=lambda _: None)
    stored = json.loads((tmp_path / "utility" / "none__s0.json").read_text())
    trials = stored["tuned"]["trials"]
    assert [t["values"] for t in trials] == [{"model.init_args.lr": 1e-9}, {"model.init_args.lr": 0.01}]
    assert trials[1]["val_accuracy"] > trials[0]["val_accuracy"]  # a model that barely moves scores lower
    assert stored["tuned"]["chosen"] == {"model.init_args.lr": 0.01}
    assert (tmp_path / "runs" / "utility" / "none__s0__tuning" / "trial_1").is_dir()
    (spec,) = trained  # with the chosen setting, at the utility run's own loop (not the trials')
    assert spec["model"]["init_args"]["lr"] == 0.01 and spec["loop"]["local_steps"] == TINY["loop"]["local_steps"]
    assert "Tuned on the clients' validation split" in (tmp_path / "bench.md").read_text()


def test_a_tune_grid_without_candidates_is_refused() -> None:
    with pytest.raises(ValueError, match=r"tune\.grid\.model\.init_args\.lr"):
        combinations({"model.init_args.lr": 0.1})


def test_the_dp_preset_tunes_every_epsilon_point_on_the_validation_split() -> None:
    settings = load_settings("configs/bench_digits_dp.yaml")
    swept = {name: entry for name, entry in settings["defences"].items() if "family" in entry}
    assert {e["family"] for e in swept.values()} == {"fed_cdp", "dual_dp_2dpfl"} and len(swept) == 6
    for name in swept:
        spec = Utility(name, 0).spec(settings)
        assert combinations(spec["tune"]["grid"]) and settings["data"].get("val_fraction", 0.1) > 0
    assert "loop" not in settings["defences"]["dual_dp_2dpfl@8"]["tune"]  # calibrated sigma: trials train all rounds


def test_the_cross_device_preset_has_100_clients_and_a_dp_fedavg_point_at_epsilon_2_or_less() -> None:
    from lightning_fl.privacy.accounting import PrivacyAccountant

    settings = load_settings("configs/bench_digits_cross_device.yaml")
    data, loop = settings["data"], settings["loop"]
    assert data["num_clients"] >= 100
    rate = loop["clients_per_round"] / data["num_clients"]
    epsilons = [
        PrivacyAccountant().epsilon_after(
            delta=1e-5, noise_multiplier=e["strength"]["value"], sample_rate=rate, steps=loop["num_rounds"]
        )
        for e in settings["defences"].values()
        if e.get("family") == "dp_fedavg"
    ]
    assert min(epsilons) <= 2 and max(epsilons) >= 100 and any(2 < e <= 8 for e in epsilons)
