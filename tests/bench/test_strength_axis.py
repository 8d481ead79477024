"""A defence swept over its strength (issue 31, item 1): one utility run and attack run per value, one curve."""

from __future__ import annotations

import csv

import pytest

from lightning_fl.bench import cells, expand_strengths, load_settings, run_bench, utilities
from lightning_fl.bench.grid import select
from lightning_fl.bench.report import privacy_curves
from tests.bench.test_bench import MINI

_PRUNING = {"class_path": "lightning_fl.defences.GradientPruning", "init_args": {"ratio": 0.7}}
TINY = {
    **MINI,
    "loop": {**MINI["loop"], "num_rounds": 1, "local_steps": 2},
    "attack_run": {**MINI["attack_run"], "model": {"init_args": {"optimizer": "sgd", "lr": 0.1}}},
    "threat_models": {"fedsgd_b1": {"leak_point": "client_update", "data": {"batch_size": 1}}},
    "attacks": {"dlg": {"class_path": "lightning_fl.attacks.DLGAttack", "init_args": {"max_iterations": 30}}},
    "defences": {
        "none": {},
        "pruning": {"defences": [_PRUNING], "strength": {"key": "init_args.ratio", "values": [0.2, 0.999]}},
    },
}


def test_a_two_value_strength_axis_gives_a_utility_run_and_rows_per_value_and_a_curve_of_two_points(tmp_path) -> None:
    rows = run_bench(TINY, tmp_path, print_=lambda _: None)
    assert [(r["defence"], r["family"], r["strength"]) for r in rows] == [
        ("none", "none", None),
        ("pruning@0.2", "pruning", 0.2),
        ("pruning@0.999", "pruning", 0.999),
    ]
    assert all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    for value in ("0.2", "0.999"):  # each strength trained and attacked at its own value
        assert (tmp_path / "utility" / f"pruning@{value}__s0.json").exists()
    curve = privacy_curves(rows, "fedsgd_b1")
    assert [r["strength"] for r in curve["pruning"]] == [0.2, 0.999] and len(curve["none"]) == 1
    weak, strong = curve["pruning"]  # the effect is real: pruning 99.9 % of the update leaves little to invert
    assert strong["ssim_mean"] < weak["ssim_mean"]
    table = list(csv.DictReader((tmp_path / "bench.csv").open()))
    assert [t["strength"] for t in table] == ["", "0.2", "0.999"]
    markdown = (tmp_path / "bench.md").read_text()
    assert "| pruning | 0.999 |" in markdown and "| strength |" in markdown
    assert (tmp_path / "privacy_utility.png").stat().st_size > 0


def test_a_strength_axis_expands_selects_by_family_and_applies_to_its_family(tmp_path) -> None:
    only_pruning = {"class_path": "x.Y", "applies_to": ["pruning"]}
    grid = expand_strengths({**TINY, "attacks": {**TINY["attacks"], "ig": only_pruning}})
    assert list(grid["defences"]) == ["none", "pruning@0.2", "pruning@0.999"]
    assert grid["defences"]["pruning@0.999"]["defences"][0]["init_args"] == {"ratio": 0.999}
    assert expand_strengths(grid) == grid  # expanded settings stay as they are
    assert {c.defence for c in cells(grid) if c.attack == "ig"} == {"pruning@0.2", "pruning@0.999"}
    assert list(select(grid, "defences", ["pruning"])["defences"]) == ["pruning@0.2", "pruning@0.999"]
    with pytest.raises(ValueError, match=r"pruning@0.5.*one strength: \['pruning@0.2', 'pruning@0.999'\]"):
        select(grid, "defences", ["pruning@0.5"])  # a value not swept: the error lists those that are
    assert len(utilities(grid)) == 3
    config = tmp_path / "bench.yaml"
    config.write_text("base: " + str((tmp_path.cwd() / "configs" / "bench_digits.yaml").resolve()) + "\n")
    quick = load_settings(config, quick=True)
    families: dict[str, int] = {}
    for entry in quick["defences"].values():
        families[entry.get("family", "")] = families.get(entry.get("family", ""), 0) + 1
    assert min(n for f, n in families.items() if f) >= 3  # the quick preset's swept defences: >= 3 strengths
    config.write_text(config.read_text() + "only: {defences: [none, pruning_70@0.9]}\n")  # a config's only: names
    assert list(load_settings(config, quick=True)["defences"]) == ["none", "pruning_70@0.9"]  # one strength too


@pytest.mark.parametrize("quick", [True, False])
def test_both_digits_presets_draw_every_swept_defence_under_every_threat_model_within_their_measured_size(
    quick: bool,
) -> None:
    settings = load_settings("configs/bench_digits.yaml", quick=quick)
    grid = cells(settings)
    for threat in settings["threat_models"]:  # a curve of >= 3 points per family and threat model
        points: dict[str, set[str]] = {}
        for cell in grid:
            if cell.threat_model == threat and "family" in settings["defences"][cell.defence]:
                points.setdefault(settings["defences"][cell.defence]["family"], set()).add(cell.defence)
        assert len(points) == 8 and min(len(p) for p in points.values()) >= 3, (threat, points)
    # the sizes docs/bench.md gives ("Digits, quick preset" timed; "Digits, full preset" counted): growing either
    # needs a new measurement
    most_utilities, most_cells = (27, 469) if quick else (81, 4089)
    assert len(utilities(settings)) <= most_utilities and len(grid) <= most_cells


@pytest.mark.parametrize(
    ("axis", "fix"),
    [({"key": "init_args.ratio"}, "values"), ({"key": "defences.3.init_args.ratio", "values": [0.5]}, "defences.3")],
)
def test_a_malformed_strength_axis_is_refused_naming_the_defence(axis, fix) -> None:
    grid = {**TINY, "defences": {"pruning": {"defences": [_PRUNING], "strength": axis}}}
    with pytest.raises(ValueError, match=f"defences.pruning.strength.*{fix}"):
        expand_strengths(grid)


def test_an_attack_strength_arg_models_the_defence_at_each_strength() -> None:
    noise = {"class_path": "lightning_fl.defences.GaussianNoise", "init_args": {"noise_std": 0.01}}
    aware = {
        "class_path": "lightning_fl.attacks.NoiseAwareAttack",
        "init_args": {"noise": "gaussian", "noise_scale": 0.01},
        "applies_to": ["noise"],
        "strength_arg": "noise_scale",
    }
    grid = {
        **TINY,
        "attacks": {**TINY["attacks"], "aware": aware},
        "defences": {
            "noise": {"defences": [noise], "strength": {"key": "init_args.noise_std", "values": [0.001, 0.1]}}
        },
    }
    settings = expand_strengths(grid)
    scales = {
        c.defence: c.spec(settings)["attack"]["init_args"]["noise_scale"]
        for c in cells(settings)
        if c.attack == "aware"
    }
    assert scales == {"noise@0.001": 0.001, "noise@0.1": 0.1}  # not the entry's 0.01 at every strength
    dlg = [c.spec(settings)["attack"] for c in cells(settings) if c.attack == "dlg"]
    assert all(a["init_args"] == {"max_iterations": 30} for a in dlg)  # an attack without strength_arg is unchanged


def test_a_strength_arg_without_applies_to_is_refused(tmp_path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(
        "base: " + str((tmp_path.cwd() / "configs" / "bench_digits.yaml").resolve()) + "\n"
        "attacks: {ig: {strength_arg: lr}}\n"
    )
    with pytest.raises(ValueError, match=r"attacks\.ig\.strength_arg needs applies_to"):
        load_settings(config)
