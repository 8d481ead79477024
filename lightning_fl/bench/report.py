"""What a person reads after ``lightning-fl bench``: ``bench.csv``, ``bench.md``, the privacy–utility scatter and
the attack-success heatmap (PNG, matplotlib Agg), and the same table and plots in W&B when a project is given."""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["COLUMNS", "log_to_wandb", "summarise", "write_csv", "write_heatmap", "write_markdown", "write_scatter"]

_VALUES = ("test_accuracy", "epsilon", "psnr", "ssim", "lpips", "label_accuracy", "success_rate")
COLUMNS = (
    "defence",
    "attack",
    "leak_point",
    "seeds",
    *(f"{v}_{s}" for v in _VALUES for s in ("mean", "std")),
    "cpu_seconds",
    "status",
)
"""``bench.csv``: one row per (defence, attack, leak point); mean and sample std over the seeds."""


def _stats(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None, None
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


def summarise(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Group cell results over seeds: one row per (defence, attack, leak point), in first-seen order."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["defence"], r["attack"], r["leak_point"]), []).append(r)
    rows = []
    for (defence, attack, leak_point), runs in groups.items():
        row: dict[str, Any] = {"defence": defence, "attack": attack, "leak_point": leak_point, "seeds": len(runs)}
        for value in _VALUES:
            row[f"{value}_mean"], row[f"{value}_std"] = _stats([r.get(value) for r in runs])
        row["cpu_seconds"] = sum(r.get("cpu_seconds") or 0.0 for r in runs)
        row["status"] = "; ".join(sorted({r["status"] for r in runs}))
        rows.append(row)
    return rows


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """``bench.csv``: the columns of :data:`COLUMNS`, empty where a value is undefined (ε without DP)."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in COLUMNS})
    return path


def _cell(row: Mapping[str, Any], value: str, digits: int) -> str:
    mean, std = row[f"{value}_mean"], row[f"{value}_std"]
    if mean is None:
        return "–"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if row["seeds"] > 1 else "")


def write_markdown(rows: Sequence[Mapping[str, Any]], path: Path, *, command: str) -> Path:
    """``bench.md``: the table, mean ± std over seeds, with the command that made it."""
    header = "| defence | attack | leak point | test acc. | ε | PSNR (dB) | SSIM | LPIPS | label acc. | success |"
    lines = [f"Made by `{command}`.", "", header, "|" + "---|" * 10]
    for r in rows:
        values = [
            _cell(r, "test_accuracy", 3),
            _cell(r, "epsilon", 2),
            _cell(r, "psnr", 1),
            _cell(r, "ssim", 3),
            _cell(r, "lpips", 3),
            _cell(r, "label_accuracy", 2),
            _cell(r, "success_rate", 2),
        ]
        lines.append(f"| {r['defence']} | {r['attack']} | {r['leak_point']} | " + " | ".join(values) + " |")
    seeds = sorted({r["seeds"] for r in rows})
    lines += ["", f"Seeds per cell: {seeds}. Success: share of attacked events with SSIM ≥ the config's success_ssim."]
    path.write_text("\n".join(lines) + "\n")
    return path


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def write_scatter(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Privacy–utility scatter: test accuracy against the strongest attack's PSNR and SSIM per defence.

    One marker per defence (its most successful attack by mean PSNR over all leak points), error bars = std over
    seeds on both axes. Up and to the left is better: high accuracy, poor reconstructions.
    """
    fig = _figure(11, 4.5)
    axes = fig.subplots(1, 2)
    markers = "osD^v<>pP*Xh"
    defences = list(dict.fromkeys(r["defence"] for r in rows))
    for i, defence in enumerate(defences):
        scored = [r for r in rows if r["defence"] == defence and r["psnr_mean"] is not None]
        if not scored:
            continue
        worst = max(scored, key=lambda r: r["psnr_mean"])
        for ax, metric in zip(axes, ("psnr", "ssim"), strict=True):
            ax.errorbar(
                worst[f"{metric}_mean"],
                worst["test_accuracy_mean"] or 0.0,
                xerr=worst[f"{metric}_std"] or 0.0,
                yerr=worst["test_accuracy_std"] or 0.0,
                marker=markers[i % len(markers)],
                linestyle="none",
                capsize=3,
                label=f"{defence} ({worst['attack']})",
            )
    for ax, label in zip(axes, ("attack PSNR (dB) of the strongest attack", "attack SSIM"), strict=True):
        ax.set_xlabel(label)
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0.0, 1.0)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle("privacy–utility: each marker one defence, error bars over seeds")
    fig.savefig(path, dpi=110)
    return path


def write_heatmap(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Attack success heatmap: attacks × defences, one panel per leak point, the success rate in each cell."""
    leak_points = list(dict.fromkeys(r["leak_point"] for r in rows))
    attacks = list(dict.fromkeys(r["attack"] for r in rows))
    defences = list(dict.fromkeys(r["defence"] for r in rows))
    fig = _figure(1.1 * len(defences) * len(leak_points) + 2, 0.6 * len(attacks) + 2)
    for ax, leak_point in zip(fig.subplots(1, len(leak_points), squeeze=False)[0], leak_points, strict=True):
        grid = [[math.nan] * len(defences) for _ in attacks]
        for r in rows:
            if r["leak_point"] == leak_point and r["success_rate_mean"] is not None:
                grid[attacks.index(r["attack"])][defences.index(r["defence"])] = r["success_rate_mean"]
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="Reds", aspect="auto")
        for a, line in enumerate(grid):
            for d, value in enumerate(line):
                colour = "white" if value > 0.6 else "black"  # readable on dark cells; NaN compares False
                text = "n/a" if math.isnan(value) else f"{value:.2f}"
                ax.text(d, a, text, ha="center", va="center", fontsize=8, color=colour)
        ax.set_xticks(range(len(defences)), defences, rotation=45, ha="right")
        ax.set_yticks(range(len(attacks)), attacks)
        ax.set_title(f"attack success at {leak_point}")
    fig.colorbar(image, ax=fig.axes, label="attack success rate")
    fig.savefig(path, dpi=110)
    return path


def log_to_wandb(
    rows: Sequence[Mapping[str, Any]], pictures: Sequence[Path], *, project: str, output_dir: Path
) -> None:
    """The table as a W&B Table and the two PNGs as images, in one (offline by default) W&B run."""
    import os

    import wandb

    run = wandb.init(
        project=project, dir=str(output_dir), mode=os.environ.get("WANDB_MODE", "offline"), job_type="bench"
    )
    run.log(
        {
            "bench": wandb.Table(columns=list(COLUMNS), data=[[r.get(c) for c in COLUMNS] for r in rows]),
            **{p.stem: wandb.Image(str(p)) for p in pictures},
        }
    )
    run.finish()
