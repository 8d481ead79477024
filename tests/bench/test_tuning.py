"""A defence's settings tuned per strength on the validation split before its utility run (issue 31, item 2)."""

from __future__ import annotations

import json

import pytest

from lightning_fl.bench import Utility, cell, run_bench
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
