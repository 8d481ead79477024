"""Fed-CDP / Fed-SDP at the paper's sigma: test accuracy per round against the number of clients averaged per round.

Issue 14: at sigma = 6 (Wei et al., ICDCS 2021, Table II) our 2-clients-a-round digits federation stays at chance,
where the paper averages K_t = 100 clients a round (K = 1000, K_t/K = 10%). The noise each client adds is
independent, so averaging K_t updates divides its standard deviation by sqrt(K_t) (Fed-CDP, client-side Fed-SDP)
or by K_t (server-side Fed-SDP, one draw on the sum); the clipped signal does not shrink. This script measures
that directly on the ``configs/fed_cdp_digits.yaml`` setting (shards of 2 classes, B = 5, one local epoch, SGD
lr 0.05, uniform FedSGD-style average), varying only the number of clients and how many of them train per round.

Settings: ``configs/fed_dp_clients_per_round.yaml`` (``--config``; flags override it), which names the fit config.
Writes ``<out>/curves.csv`` (defence, clients, per_round, seed, round, test_accuracy, epsilon, cpu_s; appended as
runs finish) and prints the final accuracy per row. Not run in CI::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fed_dp_clients_per_round.py --clients 20 --per-round 2 20
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from _config import parse_args
from _results import csv_appender

from lightning_fl.bench import fit_config_spec, scratch_loop

FIELDS = ("defence", "clients", "per_round", "seed", "round", "test_accuracy", "epsilon", "cpu_s")


def _component(name: str, **init_args: Any) -> dict[str, Any]:
    return {"class_path": f"lightning_fl.defences.{name}", "init_args": init_args}


def defence_options(name: str, fed_cdp: dict[str, Any]) -> dict[str, Any]:
    """Spec entries of one row: no DP, Fed-CDP (the fit config's), or Fed-SDP client- or server-side at its sigma."""
    sigma, clip = fed_cdp["init_args"]["noise_multiplier"], fed_cdp["init_args"]["max_grad_norm"]
    if name == "none":
        return {}
    if name == "fed_cdp":
        return {"defences": [fed_cdp]}
    if name == "fed_sdp":
        return {"client_transforms": [_component("FedSDP", noise_multiplier=sigma, max_grad_norm=clip)]}
    if name == "fed_sdp_server":
        return {
            "client_transforms": [_component("FedSDP", noise_multiplier=0.0, max_grad_norm=clip)],
            "server_transforms": [_component("FedSDPServerNoise", noise_multiplier=sigma, max_grad_norm=clip)],
        }
    raise ValueError(f"--defences {name!r} is unknown; use none, fed_cdp, fed_sdp or fed_sdp_server.")


def run(
    fit: dict[str, Any],
    defence: str,
    *,
    clients: int,
    per_round: int,
    rounds: int,
    seed: int,
    local_epochs: int | None = None,
) -> list[dict]:
    """One row's run of the fit config with ``clients`` clients, ``per_round`` a round; its evaluated rounds."""
    options = defence_options(defence, fit["defences"][0])
    loop = {
        **fit["loop"],
        "num_rounds": rounds,
        "clients_per_round": per_round,
        "local_epochs": local_epochs or fit["loop"]["local_epochs"],
        "eval_every": max(1, rounds // 6),
    }
    spec = {
        **fit,
        "seed": seed,
        "data": {**fit["data"], "num_clients": clients},
        "defences": options.pop("defences", []),
        "loop": {**loop, **options},
    }
    with scratch_loop(spec) as federation:
        start = time.process_time()
        history = federation.fit()["history"]
        cpu = time.process_time() - start
    return [
        {"round": i, "test_accuracy": h["test_accuracy"], "epsilon": h.get("epsilon", ""), "cpu_s": round(cpu, 1)}
        for i, h in enumerate(history)
        if "test_accuracy" in h
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/fed_dp_clients_per_round.yaml"))
    parser.add_argument("--fit-config", type=Path, help="fit config for data, model, aggregation and FedCDP")
    parser.add_argument("--defences", nargs="+", help="none, fed_cdp, fed_sdp, fed_sdp_server")
    parser.add_argument("--clients", type=int)
    parser.add_argument("--per-round", type=int, nargs="+")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--local-epochs", type=int, help="local epochs a round (default: the fit config's)")
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--out", type=Path)
    args = parse_args(parser)
    fit = fit_config_spec(args.fit_config)
    with csv_appender(args.out / "curves.csv", FIELDS) as append:
        for seed in args.seeds:
            for per_round in args.per_round:
                for defence in args.defences:
                    rows = run(
                        fit,
                        defence,
                        clients=args.clients,
                        per_round=per_round,
                        rounds=args.rounds,
                        seed=seed,
                        local_epochs=args.local_epochs,
                    )
                    common = {"defence": defence, "clients": args.clients, "per_round": per_round, "seed": seed}
                    append({**common, **r} for r in rows)
                    last = rows[-1]
                    curve = " ".join(f"{r['test_accuracy']:.3f}" for r in rows)
                    print(
                        f"{defence} K={args.clients} K_t={per_round} seed={seed}: {curve} "
                        f"(epsilon {last['epsilon']}, {last['cpu_s']} CPU s)",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
