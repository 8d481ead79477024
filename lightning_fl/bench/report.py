"""What a person reads after ``lightning-fl bench``: ``bench.csv``, ``bench.md``, the privacy–utility panels and
the attack-success heatmap (one panel per threat model; PNG, matplotlib Agg), and the same table and plots in W&B
when a project is given."""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "COLUMNS",
    "log_to_wandb",
    "pareto_front",
    "summarise",
    "write_csv",
    "write_heatmap",
    "write_markdown",
    "write_scatter",
]

_UTILITY = ("test_accuracy", "epsilon")
_ATTACK = ("psnr", "ssim", "lpips", "label_accuracy", "exact", "success_rate")
_VALUES = (*_UTILITY, *_ATTACK)
COLUMNS = (
    "defence",
    "attack",
    "threat_model",
    "leak_point",
    "server",
    "seeds",
    *(f"{v}_{s}" for v in _VALUES for s in ("mean", "std")),
    "utility_rounds",
    "cpu_seconds",
    "status",
)
"""``bench.csv``: one row per (defence, attack, threat model); mean and sample std over the seeds. ``test_accuracy``
and ``epsilon`` come from the defence's utility runs (the same in every row of a defence), ``utility_rounds`` is the
fewest rounds one of them completed. ``server``: the attack's threat model of the server, ``honest-but-curious``
(it reads what it receives) or ``malicious`` (it changed the model it ships); ``exact``: the share of the images
behind an attacked update recovered at PSNR ≥ 30 dB."""


def _stats(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None, None
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


def summarise(results: Sequence[Mapping[str, Any]], utility: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Group cell results over seeds: one row per (defence, attack, threat model), in first-seen order, with the
    utility (test accuracy, ε) of the defence's utility runs of the same seeds.

    Args:
        results: attack cell entries (``defence``, ``attack``, ``threat_model``, ``seed``, scores, ``status``).
        utility: utility run entries by key ``<defence>__s<seed>``.
    """
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["defence"], r["attack"], r["threat_model"]), []).append(r)
    rows = []
    for (defence, attack, threat_model), runs in groups.items():
        trained = [utility.get(f"{defence}__s{r['seed']}", {"status": "missing"}) for r in runs]
        row: dict[str, Any] = {"defence": defence, "attack": attack, "threat_model": threat_model, "seeds": len(runs)}
        row["leak_point"] = runs[0].get("leak_point")
        row["server"] = runs[0].get("server", "honest-but-curious")
        for value in _UTILITY:
            row[f"{value}_mean"], row[f"{value}_std"] = _stats([u.get(value) for u in trained])
        for value in _ATTACK:
            row[f"{value}_mean"], row[f"{value}_std"] = _stats([r.get(value) for r in runs])
        rounds = [u["rounds"] for u in trained if u.get("rounds") is not None]
        row["utility_rounds"] = min(rounds) if rounds else None
        row["cpu_seconds"] = sum(r.get("cpu_seconds") or 0.0 for r in runs)
        status = {r["status"] for r in runs} | {f"utility {u['status']}" for u in trained if u["status"] != "ok"}
        row["status"] = "; ".join(sorted(status))
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


def _epsilon(row: Mapping[str, Any], bound: float) -> str:
    """ε with a warning mark above ``bound``: beyond it the guarantee means little."""
    text = _cell(row, "epsilon", 2)
    return text + " ⚠" if row["epsilon_mean"] is not None and row["epsilon_mean"] > bound else text


def write_markdown(rows: Sequence[Mapping[str, Any]], path: Path, *, command: str, epsilon_bound: float) -> Path:
    """``bench.md``: the utility of each defence, then one attack table per threat model (mean ± std over seeds),
    with the command that made them."""
    lines = [f"Made by `{command}`.", "", "| defence | test acc. | ε | rounds |", "|---|---|---|---|"]
    for defence in dict.fromkeys(r["defence"] for r in rows):
        r = next(r for r in rows if r["defence"] == defence)
        lines.append(
            f"| {defence} | {_cell(r, 'test_accuracy', 3)} | {_epsilon(r, epsilon_bound)} | "
            f"{r['utility_rounds'] if r['utility_rounds'] is not None else '–'} |"
        )
    header = "| defence | attack | server | test acc. | ε | PSNR (dB) | SSIM | LPIPS | label acc. | exact | success "
    header += "| status |"
    for threat_model in dict.fromkeys(r["threat_model"] for r in rows):
        chosen = [r for r in rows if r["threat_model"] == threat_model]
        lines += [
            "",
            f"Threat model `{threat_model}` (leak point {chosen[0]['leak_point']}):",
            "",
            header,
            "|" + "---|" * 12,
        ]
        for r in chosen:
            values = [_cell(r, "test_accuracy", 3), _epsilon(r, epsilon_bound)]
            values += [_cell(r, v, d) for v, d in (("psnr", 1), ("ssim", 3), ("lpips", 3), ("label_accuracy", 2))]
            values += [_cell(r, "exact", 2), _cell(r, "success_rate", 2), r["status"]]
            lines.append(f"| {r['defence']} | {r['attack']} | {r['server']} | " + " | ".join(values) + " |")
    seeds = sorted({r["seeds"] for r in rows})
    lines += [
        "",
        f"Seeds per cell: {seeds}. Test accuracy and ε: the defence's utility run (the config's data, model and loop "
        "settings); the attack scores: its short attack runs. Success: share of attacked events with SSIM ≥ the "
        "config's success_ssim. Exact: share of the images behind an attacked update recovered at PSNR ≥ 30 dB. "
        "Server: honest-but-curious (reads what it receives) or malicious (changed the model it ships, e.g. Robbing "
        f"the Fed's imprint). ⚠: ε > {epsilon_bound:g} (epsilon_bound), a guarantee too weak to mean much.",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _attack_label(row: Mapping[str, Any]) -> str:
    """An attack's name in the plots, with its threat model when the server is malicious."""
    return row["attack"] + (", malicious server" if row.get("server") == "malicious" else "")


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points ``(attack PSNR, accuracy)`` that no other point beats on both (lower PSNR, higher
    accuracy), ordered by PSNR.

    Example:
        >>> pareto_front([(10.0, 0.5), (20.0, 0.9), (15.0, 0.4), (30.0, 0.95)])
        [0, 1, 3]
    """
    front = [
        i for i, (x, y) in enumerate(points) if not any(x2 <= x and y2 >= y and (x2, y2) != (x, y) for x2, y2 in points)
    ]
    return sorted(front, key=lambda i: points[i][0])


def _spread(targets: Sequence[float], gap: float, low: float, high: float) -> list[float]:
    """Label heights near ``targets`` (sorted ascending) at least ``gap`` apart, within [low, high]."""
    placed: list[float] = []
    for y in targets:
        placed.append(max(y, placed[-1] + gap) if placed else max(y, low))
    overflow = placed[-1] - high if placed else 0.0
    if overflow > 0:  # shift down from the top, keeping the gaps
        placed[-1] = high
        for i in range(len(placed) - 2, -1, -1):
            placed[i] = min(placed[i], placed[i + 1] - gap)
    return placed


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def write_scatter(rows: Sequence[Mapping[str, Any]], path: Path, *, epsilon_bound: float = 10.0) -> Path:
    """Privacy–utility panels, one per threat model: each defence's test accuracy (its utility run) against the
    PSNR of the strongest attack on it under that threat model; error bars = std over seeds.

    Up and to the left is better (high accuracy, poor reconstructions); the Pareto front (no other defence has
    both a lower attack PSNR and a higher accuracy) is the dashed line. Labels sit in a column beside the panel,
    spread so that they never overlap, with a line to their point; ε above ``epsilon_bound`` is marked ⚠.
    """
    threat_models = list(dict.fromkeys(r["threat_model"] for r in rows))
    columns = min(2, len(threat_models))
    lines = math.ceil(len(threat_models) / columns)
    fig = _figure(6.4 * columns, 4.2 * lines)
    axes = fig.subplots(lines, columns, squeeze=False).ravel()
    for ax in axes[len(threat_models) :]:
        ax.set_visible(False)
    for ax, threat_model in zip(axes, threat_models, strict=False):
        unreadable = [r["defence"] for r in rows if r["threat_model"] == threat_model and "readable" in r["status"]]
        if unreadable:  # no reconstruction to score: the server read only ciphertexts
            ax.text(
                0.02,
                0.02,
                "nothing readable: " + ", ".join(dict.fromkeys(unreadable)),
                transform=ax.transAxes,
                fontsize=7,
                color="0.3",
            )
        best: list[Mapping[str, Any]] = []
        for defence in dict.fromkeys(r["defence"] for r in rows):
            scored = [r for r in rows if (r["defence"], r["threat_model"]) == (defence, threat_model)]
            scored = [r for r in scored if r["psnr_mean"] is not None and r["test_accuracy_mean"] is not None]
            if scored:
                best.append(max(scored, key=lambda r: r["psnr_mean"]))
        points = [(r["psnr_mean"], r["test_accuracy_mean"]) for r in best]
        front = pareto_front(points)
        for i, r in enumerate(best):
            warn = r["epsilon_mean"] is not None and r["epsilon_mean"] > epsilon_bound
            ax.errorbar(
                *points[i],
                xerr=r["psnr_std"] or 0.0,
                yerr=r["test_accuracy_std"] or 0.0,
                marker="o",
                color="tab:red" if warn else "tab:blue",
                linestyle="none",
                capsize=3,
                markerfacecolor="white" if i not in front else None,
            )
        if len(front) > 1:
            ax.plot(*zip(*(points[i] for i in front), strict=True), "--", color="grey", label="Pareto front")
            ax.legend(fontsize=7, loc="lower right")
        order = sorted(range(len(best)), key=lambda i: points[i][1])
        heights = _spread([points[i][1] for i in order], gap=0.06, low=0.0, high=1.0)
        for i, height in zip(order, heights, strict=True):
            r = best[i]
            label = f"{r['defence']} ({_attack_label(r)})"
            if r["epsilon_mean"] is not None:
                label += f" ε={r['epsilon_mean']:.3g}" + (" ⚠" if r["epsilon_mean"] > epsilon_bound else "")
            ax.annotate(
                label,
                xy=points[i],
                xytext=(1.02, height),
                textcoords=("axes fraction", "data"),
                fontsize=7,
                va="center",
                arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.6},
            )
        ax.set_xlabel("PSNR (dB) of the strongest attack")
        ax.set_ylabel("test accuracy (utility run)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.set_title(f"threat model {threat_model} ({best[0]['leak_point'] if best else 'no scores'})", fontsize=9)
    fig.suptitle(f"privacy–utility per threat model; filled: Pareto front; red ⚠: ε > {epsilon_bound:g}", fontsize=9)
    fig.savefig(path, dpi=100)
    return path


def write_heatmap(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Attack success heatmap: attacks × defences, one panel per threat model, the success rate in each cell."""
    threat_models = list(dict.fromkeys(r["threat_model"] for r in rows))
    attacks = list(dict.fromkeys(_attack_label(r) for r in rows))
    defences = list(dict.fromkeys(r["defence"] for r in rows))
    label_width = 0.07 * max(len(a) for a in attacks)  # every panel repeats the attack names
    fig = _figure((0.55 * len(defences) + label_width) * len(threat_models) + 1.5, 0.45 * len(attacks) + 2.2)
    image = None
    for ax, threat_model in zip(fig.subplots(1, len(threat_models), squeeze=False)[0], threat_models, strict=True):
        grid = [[math.nan] * len(defences) for _ in attacks]
        for r in rows:
            if r["threat_model"] == threat_model and r["success_rate_mean"] is not None:
                grid[attacks.index(_attack_label(r))][defences.index(r["defence"])] = r["success_rate_mean"]
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="Reds", aspect="auto")
        for a, line in enumerate(grid):
            for d, value in enumerate(line):
                colour = "white" if value > 0.6 else "black"  # readable on dark cells; NaN compares False
                text = "" if math.isnan(value) else f"{value:.1f}"
                ax.text(d, a, text, ha="center", va="center", fontsize=6, color=colour)
        ax.set_xticks(range(len(defences)), defences, rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(attacks)), attacks, fontsize=7)
        ax.set_title(threat_model, fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=fig.axes, label="attack success rate (empty: not run)")
    fig.savefig(path, dpi=100)
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
