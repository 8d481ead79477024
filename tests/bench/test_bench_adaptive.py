"""The adaptive attacks and the aggregate threat model as bench grid entries, and an aggregate cell run for real."""

from __future__ import annotations

import json

import pytest

from lightning_fl.bench import cells, load_settings, run_bench
from lightning_fl.bench.grid import family
from tests.bench.test_bench import MINI

ADAPTIVE = {
    "ig_known_mask": "pruning_70",
    "ig_noise_aware": "gaussian_noise",
    "ig_keylock_unknowns": "fedkl_keylock",
    "ig_passport_unknowns": "fdl_pp_passports",
    "ig_split_unknowns": "fdl_pp_split",
}


@pytest.mark.parametrize("config", ["configs/bench_digits.yaml", "configs/bench_photos.yaml"])
def test_each_adaptive_attack_runs_beside_inverting_gradients_against_its_defence_only(config: str) -> None:
    settings = load_settings(config, quick=True)
    grid = cells(settings)
    families = {family(settings, d) for d in settings["defences"]}  # a defence swept over its strength: all values
    present = {attack: defence for attack, defence in ADAPTIVE.items() if defence in families}
    assert len(present) >= 4 and set(present) <= set(settings["attacks"])
    for attack, defence in present.items():
        assert {family(settings, c.defence) for c in grid if c.attack == attack} == {defence}
        named = {t for t, threat in settings["threat_models"].items() if attack not in threat.get("attacks", [attack])}
        beside = {(c.defence, c.threat_model, c.seed) for c in grid if c.attack == "ig" and c.threat_model not in named}
        attacked = {(c.defence, c.threat_model, c.seed) for c in grid if c.attack == attack}
        assert attacked == {b for b in beside if family(settings, b[0]) == defence}
    threat = load_settings(config)["threat_models"]["aggregate_k4"]  # the full preset's (the quick digits one drops it)
    assert threat["leak_point"] == "aggregate" and threat["loop"]["clients_per_round"] == 4
    assert threat["max_images"] == 4 * threat["data"]["batch_size"]  # the K x B images behind the aggregate


def test_aggregate_of_two_clients_is_attacked_as_one_update_of_both_clients_images(tmp_path) -> None:
    """Secure aggregation's view: the FedAvg sum of 2 clients' one-image updates. Robbing the Fed's bins still copy
    both images out; Inverting Gradients reconstructs 2 images from the aggregate (K x B, from ``num_clients``)."""
    feature = {"feature": "random", "feature_mean": 0.1642, "feature_std": 0.1476}  # configs/bench_digits.yaml's
    imprint = {"class_path": "lightning_fl.attacks.MaliciousImprint", "init_args": {"num_bins": 64, **feature}}
    grid = {
        **MINI,
        "defences": {"none": {}},
        "threat_models": {
            "aggregate_k2": {
                "leak_point": "aggregate",
                "data": {"batch_size": 1},
                "loop": {"clients_per_round": 2},
                "max_images": 2,
            }
        },
        "attacks": {
            "ig": MINI["attacks"]["ig"],
            "robbing_the_fed": {
                "class_path": "lightning_fl.attacks.RobbingTheFedAttack",
                "server_plugins": [imprint],
            },
        },
    }
    rows = {r["attack"]: r for r in run_bench(grid, tmp_path, print_=lambda _: None)}
    assert all(r["status"] == "ok" and r["leak_point"] == "aggregate" for r in rows.values()), rows
    assert rows["robbing_the_fed"]["exact_mean"] == 1.0  # both clients' images copied out of the summed update
    summary = json.loads((tmp_path / "runs" / "none__aggregate_k2__s0" / "summary.json").read_text())
    (ig,) = [a for a in summary["attacks"] if a["attack"] == "ig"]
    assert ig["leaked_images"] == ig["num_images"] == 2  # gradient matching reconstructs K x B = 2 images
