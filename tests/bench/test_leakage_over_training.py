"""Leakage over training (issue 31, item 4): a threat model that attacks the utility run's own updates by round."""

from __future__ import annotations

import json

import pytest

from lightning_fl.bench import Cell, load_settings, report, run_bench
from lightning_fl.bench.report import leakage_by_round, write_leakage_by_round
from tests.bench.test_strength_axis import TINY

_OVER_TRAINING = {"leak_point": "client_update", "protocol": "utility", "max_images": 8}


def test_the_utility_protocol_attacks_the_utility_runs_own_updates_at_its_first_middle_and_last_round(
    tmp_path,
) -> None:
    grid = {
        **TINY,
        "data": {**TINY["data"], "batch_size": 4},
        "loop": {**TINY["loop"], "num_rounds": 3},
        "threat_models": {"over_training": _OVER_TRAINING},
        "defences": {"none": {}, "pruning": {"defences": [TINY["defences"]["pruning"]["defences"][0]]}},
    }
    spec = Cell("none", "dlg", "over_training", 0).spec(grid)
    assert spec["attack_rounds"] == [0, 1, 2] and spec["model"]["init_args"]["optimizer"] == "adam"  # not attack_run
    assert spec["loop"]["local_steps"] == 2 and spec["data"]["batch_size"] == 4  # the utility run's protocol
    rows = run_bench(grid, tmp_path, print_=lambda _: None)
    assert all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    for defence in ("none", "pruning"):  # the attacked run is the utility run: the same training, the same model
        utility = json.loads((tmp_path / "runs" / "utility" / f"{defence}__s0" / "summary.json").read_text())
        attacked = json.loads((tmp_path / "runs" / f"{defence}__over_training__s0" / "summary.json").read_text())
        assert attacked["test_accuracy"] == utility["test_accuracy"]
        assert sorted({a["round"] for a in attacked["attacks"]}) == [0, 1, 2]
        assert {a["ground_truth_size"] for a in attacked["attacks"]} == {8}  # 2 local steps of 4 images
    lines = leakage_by_round(rows, "over_training")
    assert set(lines) == {"none", "pruning"} and [p[0] for p in lines["none"]] == [0, 1, 2]
    assert all(low <= mean <= high for _, mean, low, high in lines["none"])
    assert (tmp_path / "leakage_by_round.png").exists()


def _row(defence: str, attack: str, by_round: dict[int, list[float]], *, prior_only: bool = False) -> dict:
    scores = [v for values in by_round.values() for v in values]
    return {
        "defence": defence,
        "family": defence,
        "attack": attack,
        "threat_model": "t",
        "prior_only": prior_only,
        "ssim_mean": sum(scores) / len(scores),
        "by_round": by_round,
        "success_ssim": 0.5,
    }


def test_the_round_plot_draws_each_defences_guess_beside_its_strongest_attack(tmp_path, monkeypatch) -> None:
    rows = [
        _row("none", "ig", {0: [0.8, 0.7, 0.9], 24: [0.1, 0.2, 0.15]}),
        _row("none", "dlg", {0: [0.1, 0.1, 0.1], 24: [0.0, 0.0, 0.1]}),
        _row("none", "prior_mean", {0: [0.3, 0.3, 0.4], 24: [0.35, 0.3, 0.3]}, prior_only=True),
        _row("pruning", "ig", {0: [0.2, 0.3, 0.25], 24: [0.1, 0.1, 0.1]}),
    ]
    attack, guess = leakage_by_round(rows, "t"), leakage_by_round(rows, "t", guess=True)
    assert [round(m, 2) for _, m, _, _ in attack["none"]] == [0.8, 0.15]  # IG, not DLG, nor the guess
    assert set(guess) == {"none"} and [round(m, 2) for _, m, _, _ in guess["none"]] == [0.33, 0.32]
    figures = []
    figure = report._figure
    monkeypatch.setattr(report, "_figure", lambda *a: figures.append(figure(*a)) or figures[-1])
    assert write_leakage_by_round(rows, tmp_path / "rounds.png") == tmp_path / "rounds.png"
    labels = [t.get_text() for t in figures[0].axes[0].get_legend().get_texts()]
    assert "none: guess (prior only)" in labels and "pruning: guess (prior only)" not in labels  # none has one
    assert (tmp_path / "rounds.png").stat().st_size > 0
    table = report._round_lines(rows, "t")  # what bench.md prints under the threat model's table
    assert table[3] == "| defence | attack | round 0 | round 24 |"
    assert table[5].startswith("| none | ig | 0.800 [") and table[5].endswith("(3) |")
    assert table[6].startswith("| none | prior_mean (guess) | 0.333 [") and table[7].startswith("| pruning | ig |")
    assert report._round_lines([{**r, "by_round": {0: [0.5]}} for r in rows], "t") == []  # one round: no table


def test_the_digits_preset_has_a_leakage_over_training_threat_model() -> None:
    settings = load_settings("configs/bench_digits.yaml")  # the full preset (the quick one leaves it out)
    over = [name for name, t in settings["threat_models"].items() if t.get("protocol") == "utility"]
    assert len(over) == 1
    spec = Cell("none", "ig", over[0], 0).spec(settings)
    assert spec["attack_rounds"] == [0, 12, 24] and spec["loop"]["local_epochs"] == 3
    assert spec["data"]["batch_size"] == 32 and spec["model"]["init_args"]["optimizer"] == "adam"


@pytest.mark.parametrize(("threat", "match"), [({"protocol": "replay"}, "protocol"), ({"attacks": ["nope"]}, "nope")])
def test_a_bad_protocol_or_attack_list_is_refused(tmp_path, threat, match) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(json.dumps({**TINY, "threat_models": {"t": {"leak_point": "client_update", **threat}}}))
    with pytest.raises(ValueError, match=match):
        load_settings(config)


def test_the_measured_rounds_preset_attacks_one_client_that_the_server_selects_at_every_attacked_round() -> None:
    import torch

    from lightning_fl.contexts import derive_seed
    from lightning_fl.server.selection import uniform_sample

    settings = load_settings("configs/bench_digits_rounds.yaml")
    assert list(settings["threat_models"]) == ["utility_rounds"] and settings["seeds"] == [0]
    spec = Cell("none", "ig", "utility_rounds", 0).spec(settings)
    assert spec["clients"] == [6] and spec["attack_rounds"] == [0, 12, 24] and spec["loop"]["local_epochs"] == 3
    for round_idx in spec["attack_rounds"]:  # the loop's uniform selection, seeded per round
        generator = torch.Generator().manual_seed(derive_seed(0, round_idx, "select"))
        assert 6 in uniform_sample(10, spec["loop"]["clients_per_round"], generator)
