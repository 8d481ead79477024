"""FedBoosting vs FedAvg on non-IID digits, per round, over seeds and Dirichlet alpha (thesis ch. 4).

Reads the setting (data, model, rounds, local epochs) from a fit config, by default
``configs/fedboosting_digits.yaml``, and runs, for every alpha in ``--alphas`` and seed in ``--seeds``:
FedAvg (sample-weighted, McMahan et al.), FedAvg with uniform 1/N weights (the thesis' baseline) and FedBoosting
with each weighting in ``--weightings`` (see :data:`lightning_fl.server.fedboosting.WEIGHTINGS`). Plaintext: the
Paillier path changes the final accuracy by at most 0.002 (benchmarks/fedboosting_tables.py).

Writes the test accuracy of the global model after every round to ``<out>/curves.csv`` (one row per method,
alpha, seed, round; appended as runs finish, so a cut-off run keeps what it measured), the mean curves to
``<out>/curves.png`` and prints a markdown table of the final accuracy (mean and per seed) with CPU seconds.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedboosting_vs_fedavg.py --seeds 0 1 2 --alphas 0.3 1.0
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path
from typing import Any

from _results import csv_appender

from lightning_fl.bench import fit_config_spec, scratch_loop

FIELDS = ("method", "alpha", "seed", "round", "test_accuracy", "cpu_s", "weights", "train_scores", "val_scores")
"""``weights``, ``train_scores`` and ``val_scores``: FedBoosting's per-client weights and the scores they came from
(training loss or accuracy; mean cross-validation loss or accuracy), client ids in order, ``;``-separated."""


def methods(weightings: list[str]) -> dict[str, dict[str, Any]]:
    """Method name -> its aggregator (``class_path``/``init_args``): the two FedAvg baselines, then one FedBoosting
    per weighting."""
    out: dict[str, dict[str, Any]] = {
        "FedAvg": {"class_path": "lightning_fl.server.FedAvg"},
        "FedAvg uniform": {"class_path": "lightning_fl.server.FedAvg", "init_args": {"weighted": False}},
    }
    for name in weightings:
        out[f"FedBoosting {name}"] = {"class_path": "lightning_fl.server.FedBoosting", "init_args": {"weighting": name}}
    return out


def run(fit: dict[str, Any], aggregator: dict[str, Any], *, alpha: float, seed: int) -> tuple[list[dict], float]:
    """One federated run of the fit config with ``aggregator``; per-round accuracies and the CPU seconds it took."""
    spec = {
        **fit,
        "seed": seed,
        "data": {**fit["data"], "alpha": alpha},
        "loop": {**fit["loop"], "aggregator": aggregator},
    }
    with scratch_loop(spec) as loop:
        start = time.process_time()
        history = loop.fit()["history"]
        cpu = time.process_time() - start
    rows = []
    for round_idx, h in enumerate(history):
        row = {"round": round_idx, "test_accuracy": h["test_accuracy"]}
        for column, prefix in (("weights", "weight"), ("train_scores", "train_score"), ("val_scores", "val_score")):
            values = sorted(
                (int(k.rsplit("_", 1)[1]), v) for k, v in h.items() if k.startswith(f"fedboosting_{prefix}_")
            )
            row[column] = ";".join(f"{v:.4g}" for _, v in values)
        rows.append(row)
    return rows, cpu


def plot(csv_path: Path, png_path: Path) -> None:
    """Mean test accuracy per round (band: min to max over seeds), one panel per alpha."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    alphas = sorted({float(r["alpha"]) for r in rows})
    fig, axes = plt.subplots(1, len(alphas), figsize=(6 * len(alphas), 4), squeeze=False, sharey=True)
    for ax, alpha in zip(axes[0], alphas, strict=True):
        for method in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in rows if r["method"] == method and float(r["alpha"]) == alpha]
            rounds = sorted({int(r["round"]) for r in mine})
            per_round = [[float(r["test_accuracy"]) for r in mine if int(r["round"]) == k] for k in rounds]
            seeds = len({r["seed"] for r in mine})
            ax.plot(rounds, [statistics.mean(v) for v in per_round], label=f"{method} ({seeds} seeds)")
            ax.fill_between(rounds, [min(v) for v in per_round], [max(v) for v in per_round], alpha=0.15)
        ax.set(title=f"digits, Dirichlet alpha={alpha}", xlabel="round", ylabel="test accuracy")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/fedboosting_digits.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.3, 1.0])
    parser.add_argument("--weightings", nargs="+", default=["inverse_losses", "accuracies", "inverse_val_losses"])
    parser.add_argument("--only", nargs="+", default=None, help="run only these method names")
    parser.add_argument("--out", type=Path, default=Path("runs/fedboosting_vs_fedavg"))
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from an existing CSV")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = args.out / "curves.csv", args.out / "curves.png"
    if args.plot_only:
        plot(csv_path, png_path)
        print(table(csv_path))
        return
    fit = fit_config_spec(args.config)
    with csv_appender(csv_path, FIELDS) as append:
        for alpha in args.alphas:
            for seed in args.seeds:
                for name, aggregator in methods(args.weightings).items():
                    if args.only is not None and name not in args.only:
                        continue
                    rows, cpu = run(fit, aggregator, alpha=alpha, seed=seed)
                    append({"method": name, "alpha": alpha, "seed": seed, "cpu_s": cpu, **r} for r in rows)
                    print(f"alpha={alpha} seed={seed} {name}: {rows[-1]['test_accuracy']:.3f} ({cpu:.0f} CPU s)")
    plot(csv_path, png_path)
    print(table(csv_path))


def table(csv_path: Path) -> str:
    """Markdown table of every run in the CSV, per alpha and method: final accuracy (mean and per seed), mean
    accuracy over rounds 10 and later, FedBoosting's largest client weight averaged over those rounds, CPU s."""
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    lines = [
        "| alpha | method | final test acc., mean (per seed) | mean acc., rounds 10+ | largest weight, rounds 10+ "
        "| CPU s/run |",
        "|---|---|---|---|---|---|",
    ]
    for alpha in sorted({float(r["alpha"]) for r in rows}):
        for method in dict.fromkeys(r["method"] for r in rows):
            runs: dict[str, list[dict]] = {}
            for r in rows:
                if r["method"] == method and float(r["alpha"]) == alpha:
                    runs.setdefault(r["seed"], []).append(r)
            if not runs:
                continue
            finals = [float(max(rs, key=lambda r: int(r["round"]))["test_accuracy"]) for rs in runs.values()]
            late = [r for rs in runs.values() for r in rs if int(r["round"]) >= 10]
            late_acc = statistics.mean(float(r["test_accuracy"]) for r in late) if late else float("nan")
            weights = [max(map(float, r["weights"].split(";"))) for r in late if r.get("weights")]
            largest = f"{statistics.mean(weights):.2f}" if weights else "-"
            cpu = statistics.mean(float(rs[0]["cpu_s"]) for rs in runs.values())
            per_seed = " / ".join(f"{a:.3f}" for a in finals)
            lines.append(
                f"| {alpha} | {method} | {statistics.mean(finals):.3f} ({per_seed}) | {late_acc:.3f} | {largest} "
                f"| {cpu:.0f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
