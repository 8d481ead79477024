"""Every DP-SGD point of a bench carries its ReRo bound beside the measured attack success (issue 31, item 3)."""

from __future__ import annotations

import csv

from lightning_fl.bench import run_bench
from tests.bench.test_strength_axis import TINY

_CDP = {"class_path": "lightning_fl.defences.FedCDP", "init_args": {"max_grad_norm": 4.0, "noise_scaling": "per_batch"}}


def test_a_dp_sgd_point_has_its_bound_above_its_measured_success_and_a_plot(tmp_path) -> None:
    grid = {
        **TINY,
        "attack_run": {**TINY["attack_run"], "loop": {**TINY["attack_run"]["loop"], "clients_per_round": 2}},
        "threat_models": {"b1": {"leak_point": "local_gradient", "data": {"batch_size": 1}}},
        "attacks": {
            **TINY["attacks"],
            "prior_mean": {"class_path": "lightning_fl.attacks.PriorBaseline", "init_args": {"guess": "mean"}},
        },
        "defences": {
            "none": {},
            "fed_cdp": {"defences": [_CDP], "strength": {"key": "init_args.noise_multiplier", "values": [0.5, 4.0]}},
        },
    }
    rows = run_bench(grid, tmp_path, print_=lambda _: None)
    dp = [r for r in rows if r["family"] == "fed_cdp" and not r["prior_only"]]
    assert [r["strength"] for r in dp] == [0.5, 4.0] and all(r["status"] == "ok" for r in dp)
    for r in dp:  # the attacked release: one step on a batch known to hold the target (q = 1)
        (sigma, q, steps), *_ = r["dp_sgd_attacked"]
        assert q == 1.0 and steps == 1 and sigma > 0
        assert r["dp_sgd_training"][0][1] < 1.0  # the utility run's Poisson rate
        assert r["rero_kappa"] <= r["rero_bound"] <= 1.0 and r["success_rate_mean"] <= r["rero_bound"]
    weak, strong = dp
    assert strong["rero_bound"] < weak["rero_bound"]  # more noise, a lower bound
    assert all(r["rero_bound"] is None for r in rows if r["family"] == "none")
    assert (tmp_path / "reconstruction_bound.png").exists()
    assert "ReRo bounds (Hayes et al., 2023)" in (tmp_path / "bench.md").read_text()
    table = list(csv.DictReader((tmp_path / "bench.csv").open()))
    assert {t["rero_bound"] != "" for t in table if t["family"] == "fed_cdp" and t["prior_only"] == "False"} == {True}


def test_2dpfl_a_bundle_whose_dp_sgd_is_a_part_records_its_mechanism(tmp_path) -> None:
    from lightning_fl.bench import Utility
    from lightning_fl.bench.cell import dp_sgd_history
    from lightning_fl.bench.experiment import fit_loop

    dual = {"class_path": "lightning_fl.defences.DualDPFL"}
    dual["init_args"] = {"target_epsilon": None, "noise_multiplier": 2.0}
    spec = Utility("dual", 0).spec({**TINY, "defences": {"dual": {"defences": [dual]}}})
    loop, _ = fit_loop(spec, tmp_path)
    (sigma, q, steps), *_ = dp_sgd_history(loop)  # None before: the bundle itself is not a ClientDPSGD
    assert sigma == 2.0 and 0 < q <= 1 and steps == TINY["loop"]["local_steps"]
