"""FDL-PP Table 1 accuracy against training length: passports in 1 or in all 3 private convolutions, vs plain DL.

Issue 14: in benchmarks/defence_tables.py (10 rounds) passports in the paper's three private convolutions cost 7.6
accuracy points that the paper (Table 1, MNIST) does not see. This runs the same setting longer and records the
curve: 16x16 digits, 5 IID clients all every round, sigmoid DLG LeNet, Adam 2e-3, batch 32, 2 local epochs; with
passports, accuracy is the mean over clients of their own model (private layers stay local) after 10 steps of
private fine-tuning, as in the table.

Settings: ``configs/fdl_pp_rounds.yaml`` (``--config``; flags override it), which takes data, model, passport
options and private fine-tuning from ``configs/fdl_pp_digits.yaml``.

Writes ``<out>/curves.csv`` (setting, seed, round, test_accuracy, cpu_s) and prints one curve per run. Not in CI::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fdl_pp_rounds.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from _config import parse_args
from _results import csv_appender

from lightning_fl.bench import fit_config_spec, scratch_loop


def run(
    fit: dict[str, Any], args: argparse.Namespace, passports: int, *, seed: int
) -> tuple[list[tuple[int, float]], float]:
    """One run of the fit config with ``passports`` passport convolutions (0: plain FedAvg); accuracy per round."""
    passport = fit["defences"][0]
    spec = {
        **fit,
        "seed": seed,
        "data": {**fit["data"], "batch_size": args.batch_size},
        "defences": [{**passport, "init_args": {**passport["init_args"], "num_convs": passports}}] if passports else [],
        "loop": {
            "num_rounds": args.rounds,
            "clients_per_round": args.clients_per_round,
            "local_epochs": args.local_epochs,
            "client_callbacks": fit["loop"]["client_callbacks"] if passports else [],
            "eval_on": "clients" if passports else "global",
            "eval_every": args.every,
        },
    }
    with scratch_loop(spec) as loop:
        start = time.process_time()
        history = loop.fit()["history"]
        cpu = time.process_time() - start
    return [(i, h["test_accuracy"]) for i, h in enumerate(history) if "test_accuracy" in h], cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/fdl_pp_rounds.yaml"), help="settings file")
    parser.add_argument("--fit-config", type=Path, help="fit config for data, model, passports, fine-tuning")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--local-epochs", type=int)
    parser.add_argument("--clients-per-round", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--every", type=int, help="evaluate every this many rounds")
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--settings", nargs="+", help="setting names (keys of the config's passports:)")
    parser.add_argument("--out", type=Path)
    args = parse_args(parser)
    fit, passports = fit_config_spec(args.fit_config), args.sweep["passports"]
    unknown = sorted(set(args.settings) - set(passports))
    if unknown:
        parser.error(f"--settings {unknown} unknown; the config's passports: names {sorted(passports)}.")
    with csv_appender(args.out / "curves.csv", ("setting", "seed", "round", "test_accuracy", "cpu_s")) as append:
        for seed in args.seeds:
            for name in args.settings:
                curve, cpu = run(fit, args, passports[name], seed=seed)
                append(
                    {"setting": name, "seed": seed, "round": r, "test_accuracy": a, "cpu_s": round(cpu, 1)}
                    for r, a in curve
                )
                points = " ".join(f"{r}:{a:.3f}" for r, a in curve)
                print(f"{name} seed={seed}: {points} ({cpu:.0f} CPU s)", flush=True)


if __name__ == "__main__":
    main()
