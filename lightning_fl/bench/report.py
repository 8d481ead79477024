"""What a person reads after ``lightning-fl bench``: ``bench.csv``, ``bench.md``, the privacy–utility panels and
the attack-success heatmap (one panel per threat model, two a line, 1600 px wide; PNG, matplotlib Agg), and the
same table and plots in W&B when a project is given. Attack scores come with 95 % bootstrap intervals over the
attacked images; a threat model whose attacks do not break the undefended model says that it cannot rank defences.
Each server of :data:`~lightning_fl.bench.grid.SERVERS` gets its own panels and verdict: a defence that holds
against one may fall to the other."""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_fl.bench.grid import SERVERS

__all__ = [
    "BROKEN_SHARE",
    "CANNOT_RANK",
    "COLUMNS",
    "INTERVALS",
    "SERVERS",
    "UNDEFENDED",
    "attack_servers",
    "breaking_attacks",
    "leakage_by_round",
    "log_to_wandb",
    "pareto_front",
    "prior_success",
    "privacy_curves",
    "psnr_text",
    "rank_note",
    "reconstruction_bounds",
    "summarise",
    "write_bounds",
    "write_csv",
    "write_heatmap",
    "write_leakage_by_round",
    "write_markdown",
    "write_scatter",
]

_UTILITY = ("test_accuracy", "epsilon")
_ATTACK = ("psnr", "ssim", "lpips", "label_accuracy", "exact", "success_rate")
_VALUES = (*_UTILITY, *_ATTACK)
INTERVALS = ("psnr", "ssim", "lpips", "success_rate")
"""Scores given with a 95 % interval, bootstrapped over the attacked images of a row (all its seeds)."""
COLUMNS = (
    "defence",
    "family",
    "strength",
    "attack",
    "threat_model",
    "leak_point",
    "server",
    "prior_only",
    "own_model",
    "seeds",
    "images",
    *(f"{v}_{s}" for v in _VALUES for s in ("mean", "std")),
    *(f"{v}_{s}" for v in INTERVALS for s in ("low", "high")),
    "psnr_capped",
    "success_ssim",
    "rero_kappa",
    "rero_bound",
    "rero_bound_training",
    "utility_rounds",
    "cpu_seconds",
    "status",
)
"""``bench.csv``: one row per (defence, attack, threat model). ``test_accuracy`` and ``epsilon``: mean and sample
std over the defence's utility runs (the same in every row of a defence); ``family`` and ``strength``: the defence
a strength variant belongs to and its value on the family's strength axis (``pruning@0.5``: ``pruning``, 0.5;
empty without an axis, :func:`~lightning_fl.bench.grid.expand_strengths`); ``utility_rounds`` is the fewest rounds one
of them completed. The scores of :data:`INTERVALS`: ``_mean`` over the row's attacked images (``images``, all seeds
together) with ``_low``/``_high`` the 95 % bootstrap interval (:func:`~lightning_fl.attacks.metrics.bootstrap_interval`,
2000 resamples, seed 0); ``psnr_mean`` is over the images whose PSNR is measured, ``psnr_capped`` counts those at
the 100 dB cap (an exact copy). Every score's ``_std``: sample std over seeds of the cells' means. ``server``: the
attack's threat model of the server, ``honest-but-curious`` (it reads what it receives) or ``malicious`` (it changed
the model it ships); ``prior_only``: a calibration row that never reads the images (:class:`PriorBaseline`);
``own_model``: the attack ran on a model of its own (the analytic attack's MLP), not the defence's, so it neither
breaks the undefended model nor sits on the defence's accuracy in the privacy-utility plot;
``exact``: the share of the images behind an attacked update recovered at PSNR ≥ 30 dB; ``success_rate``: share of
the attacked images at SSIM ≥ ``success_ssim`` that also beat their own mean colour and (for an attack that reads
the update) every prior-only guess of them (:func:`~lightning_fl.attacks.metrics.image_successes`).
``rero_bound``: for a DP-SGD defence, the upper bound on any attack's success (Hayes et al., NeurIPS 2023) for
the release the attack saw (its steps, each on a batch known to hold the target: q = 1), at ``rero_kappa``, the
prior's baseline success (:func:`reconstruction_bounds`);
``rero_bound_training``: the same bound for the whole utility run's DP-SGD (its σ, q, T)."""

UNDEFENDED = "none"
"""The defence name of the undefended row, against which a threat model's attacks are judged."""
BROKEN_SHARE = 0.5
"""An attack breaks a model when it recovers at least this share of the attacked images at SSIM ≥ the success bar."""
CANNOT_RANK = "no attack broke the undefended model here: this threat model cannot rank defences"
NO_UNDEFENDED = f"no {UNDEFENDED} row here: whether the attacks break the undefended model is unknown, so no front"
_RESAMPLES = 2000


def _server(row: Mapping[str, Any]) -> str:
    return row.get("server") or SERVERS[0]


def attack_servers(rows: Sequence[Mapping[str, Any]], threat_model: str) -> list[str]:
    """The servers of :data:`SERVERS` whose attacks (prior-only and own-model rows aside) ran under
    ``threat_model``; the honest-but-curious one alone when none did.

    Example:
        >>> rows = [{"threat_model": "t", "attack": "ig"}, {"threat_model": "t", "server": "malicious"}]
        >>> attack_servers(rows, "t"), attack_servers(rows[:1], "t")
        (['honest-but-curious', 'malicious'], ['honest-but-curious'])
    """
    present = {
        _server(r)
        for r in rows
        if r["threat_model"] == threat_model and not r.get("prior_only") and not r.get("own_model")
    }
    return [s for s in SERVERS if s in present] or [SERVERS[0]]


def _stats(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None, None
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


def _units(runs: Sequence[Mapping[str, Any]], metric: str) -> list[float]:
    """The row's values of ``metric`` per attacked image, all seeds together (a cell stored without per-image
    scores gives its mean once; one with nothing readable, its success rate of 0). ``success_rate`` per image: 1
    where its SSIM reaches the cell's success bar and beats its references (``image_successes``)."""
    values: list[float | None] = []
    for r in runs:
        images = r.get("images")
        if not images or not images.get("ssim"):
            values.append(r.get(metric))
        elif metric == "success_rate":
            from lightning_fl.attacks.metrics import image_successes

            values += image_successes(images, r["success_ssim"])
        else:
            values += images.get(metric) or []
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _intervals(row: dict[str, Any], runs: Sequence[Mapping[str, Any]]) -> None:
    """Put the per-image means and 95 % bootstrap intervals of :data:`INTERVALS` into ``row``; PSNRs at the cap
    are counted (``psnr_capped``), not averaged."""
    from lightning_fl.attacks.metrics import PSNR_CAP, bootstrap_interval

    units = {m: _units(runs, m) for m in INTERVALS}
    row["psnr_capped"] = sum(v >= PSNR_CAP for v in units["psnr"])
    units["psnr"] = [v for v in units["psnr"] if v < PSNR_CAP]
    row["images"] = len(_units(runs, "ssim"))
    for metric, values in units.items():
        mean, low, high = bootstrap_interval(values, resamples=_RESAMPLES) if values else (None, None, None)
        row[f"{metric}_mean"], row[f"{metric}_low"], row[f"{metric}_high"] = mean, low, high


def _by_round(runs: Sequence[Mapping[str, Any]]) -> dict[int, list[float]]:
    """The SSIM of every image a row's cells attacked, per attacked round, all seeds together."""
    rounds: dict[int, list[float]] = {}
    for r in runs:
        for key, scores in (r.get("by_round") or {}).items():
            rounds.setdefault(int(key), []).extend(v for v in scores.get("ssim") or [] if math.isfinite(v))
    return dict(sorted(rounds.items()))


def summarise(
    results: Sequence[Mapping[str, Any]],
    utility: Mapping[str, Mapping[str, Any]],
    defences: Mapping[str, Mapping[str, Any] | None] | None = None,
    attacks: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Group cell results over seeds: one row per (defence, attack, threat model), in first-seen order, with the
    utility (test accuracy, ε) of the defence's utility runs of the same seeds and the attack scores' means and
    intervals over the attacked images (:data:`COLUMNS`).

    Args:
        results: attack cell entries (``defence``, ``attack``, ``threat_model``, ``seed``, scores, ``images``,
            ``status``).
        utility: utility run entries by key ``<defence>__s<seed>``.
        defences: the grid's defence entries by name (expanded), for each row's ``family`` and ``strength``.
        attacks: the grid's attack entries by name, for each row's ``own_model`` (an entry with a ``model:``).
    """
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["defence"], r["attack"], r["threat_model"]), []).append(r)
    rows = []
    for (defence, attack, threat_model), runs in groups.items():
        trained = [utility.get(f"{defence}__s{r['seed']}", {"status": "missing"}) for r in runs]
        row: dict[str, Any] = {"defence": defence, "attack": attack, "threat_model": threat_model, "seeds": len(runs)}
        entry = (defences or {}).get(defence) or {}
        row["family"] = entry.get("family", defence)
        row["strength"] = (entry.get("strength") or {}).get("value")
        row["leak_point"] = runs[0].get("leak_point")
        row["server"] = _server(runs[0])
        row["prior_only"] = any(r.get("prior_only") for r in runs)
        row["own_model"] = bool(((attacks or {}).get(attack) or {}).get("model"))
        row["success_ssim"] = next((r["success_ssim"] for r in runs if r.get("success_ssim") is not None), None)
        for value in _UTILITY:
            row[f"{value}_mean"], row[f"{value}_std"] = _stats([u.get(value) for u in trained])
        for value in _ATTACK:
            row[f"{value}_mean"], row[f"{value}_std"] = _stats([r.get(value) for r in runs])
        _intervals(row, [r for r in runs if r.get("status", "").startswith("ok")])
        row["by_round"] = _by_round(runs)
        row["tuned"] = next((u["tuned"] for u in trained if u.get("tuned")), None)
        row["dp_sgd_attacked"] = next((r["dp_sgd_attacked"] for r in runs if r.get("dp_sgd_attacked")), None)
        row["dp_sgd_training"] = next((u["dp_sgd_history"] for u in trained if u.get("dp_sgd_history")), None)
        rounds = [u["rounds"] for u in trained if u.get("rounds") is not None]
        row["utility_rounds"] = min(rounds) if rounds else None
        row["cpu_seconds"] = sum(r.get("cpu_seconds") or 0.0 for r in runs)
        status = {r["status"] for r in runs} | {f"utility {u['status']}" for u in trained if u["status"] != "ok"}
        row["status"] = "; ".join(sorted(status))
        rows.append(row)
    return rows


def prior_success(rows: Sequence[Mapping[str, Any]], threat_model: str) -> float | None:
    """The prior's baseline success κ under ``threat_model``: the 95 % Clopper–Pearson upper limit of the best
    prior-only row's success (k of n images at the success bar), or ``None`` without a prior-only row.

    A guess never reads the update, so its success estimates κ of the ReRo bound; the bench's guesses are two of
    many, so a better guess could score higher (the bound then rises with it).

    Example:
        >>> rows = [{"threat_model": "t", "prior_only": True, "success_rate_mean": 0.0, "images": 20}]
        >>> round(prior_success(rows, "t"), 3)
        0.168
    """
    from scipy.stats import beta

    priors = [r for r in rows if r["threat_model"] == threat_model and r.get("prior_only") and r.get("images")]
    if not priors:
        return None
    best = max(priors, key=lambda r: r.get("success_rate_mean") or 0.0)
    n = int(best["images"])
    k = round((best.get("success_rate_mean") or 0.0) * n)
    return 1.0 if k >= n else float(beta.ppf(0.975, k + 1, n - k))


def reconstruction_bounds(rows: list[dict[str, Any]], *, kappa: float | None = None) -> None:
    """Put the ReRo bounds (:mod:`lightning_fl.privacy.reconstruction`) into each DP-SGD row of ``rows``:
    ``rero_bound`` for the release its attack saw, ``rero_bound_training`` for its utility run, both at ``kappa``
    (a bench config's ``rero_kappa``: the baseline of a prior the user names) or else at the threat model's
    estimate (:func:`prior_success`); rows without a DP-SGD mechanism, or without κ, get ``None``.

    Raises:
        ValueError: naming ``rero_kappa`` when it is not in [0, 1].
    """
    if kappa is not None and not 0.0 <= kappa <= 1.0:
        raise ValueError(f"rero_kappa={kappa}: the prior's baseline success probability lies in [0, 1].")
    from lightning_fl.privacy.reconstruction import rero_dp_sgd, rero_gaussian

    def bound(kappa: float, history: Sequence[Sequence[float]]) -> float:
        if all(q == 1.0 for _, q, _ in history):  # no subsampling: the closed form
            return rero_gaussian(kappa, math.sqrt(sum(n / s**2 for s, _, n in history)))
        return rero_dp_sgd(kappa, [(s, q, int(n)) for s, q, n in history], samples=20_000)

    threat_models = dict.fromkeys(r["threat_model"] for r in rows)
    kappas = {t: kappa if kappa is not None else prior_success(rows, t) for t in threat_models}
    cache: dict[tuple[float, str], float] = {}
    for row in rows:
        row["rero_kappa"] = kappas[row["threat_model"]] if row.get("dp_sgd_attacked") else None
        sources = (("rero_bound", row.get("dp_sgd_attacked")), ("rero_bound_training", row.get("dp_sgd_training")))
        for column, history in sources:
            at = kappas[row["threat_model"]]
            if at is None or not history or row.get("prior_only"):
                row[column] = None
                continue
            key = (at, repr(history))
            if key not in cache:
                cache[key] = bound(at, history)
            row[column] = cache[key]


def breaking_attacks(
    rows: Sequence[Mapping[str, Any]], threat_model: str, *, server: str | None = None
) -> list[Mapping[str, Any]] | None:
    """The attack rows that break the undefended model under ``threat_model`` (success rate ≥
    :data:`BROKEN_SHARE`; prior-only rows and attacks on a model of their own never count), only those of
    ``server`` when given (a malicious server's success says nothing of what an honest-but-curious one can do), or
    ``None`` when the rows have no :data:`UNDEFENDED` row.

    An empty list means the threat model cannot rank defences: a defence that "holds" there may only face an
    attacker too weak to tell.

    Example:
        >>> rows = [{"defence": "none", "threat_model": "t", "attack": "ig", "success_rate_mean": 0.25}]
        >>> breaking_attacks(rows, "t"), breaking_attacks(rows, "other")
        ([], None)
    """
    undefended = [r for r in rows if (r["defence"], r["threat_model"]) == (UNDEFENDED, threat_model)]
    if not undefended:
        return None
    attacks = [r for r in undefended if not r.get("prior_only") and not r.get("own_model")]
    attacks = [r for r in attacks if server is None or _server(r) == server]
    return [r for r in attacks if (r.get("success_rate_mean") or 0.0) >= BROKEN_SHARE]


def _guessing(rows: Sequence[Mapping[str, Any]], threat_model: str) -> Mapping[str, Any] | None:
    """The prior-only row with the highest mean SSIM under ``threat_model`` (what guessing scores), if any."""
    priors = [r for r in rows if r["threat_model"] == threat_model and r.get("prior_only")]
    priors = [r for r in priors if r.get("ssim_mean") is not None]
    return max(priors, key=lambda r: r["ssim_mean"]) if priors else None


def _success_bar(rows: Sequence[Mapping[str, Any]]) -> float | None:
    return next((r["success_ssim"] for r in rows if r.get("success_ssim") is not None), None)


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """``bench.csv``: the columns of :data:`COLUMNS`, empty where a value is undefined (ε without DP)."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in COLUMNS})
    return path


def _cell(row: Mapping[str, Any], value: str, digits: int) -> str:
    """Mean ± std over seeds (the utility values, label accuracy, exact), or the mean with its 95 % interval over
    images (:data:`INTERVALS`)."""
    mean = row[f"{value}_mean"]
    if mean is None:
        return "–"
    if value in INTERVALS:
        low, high = row.get(f"{value}_low"), row.get(f"{value}_high")
        spread = f" [{low:.{digits}f}, {high:.{digits}f}]" if low is not None and row.get("images", 0) > 1 else ""
        return f"{mean:.{digits}f}{spread}"
    std = row[f"{value}_std"]
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if row["seeds"] > 1 and std is not None else "")


def psnr_text(row: Mapping[str, Any]) -> str:
    """A row's PSNR: the mean and interval over the measured images, and the images at the 100 dB cap (exact copies)
    counted apart, never averaged as if measured.

    Example:
        >>> psnr_text({"psnr_mean": None, "psnr_capped": 4, "images": 4})
        '≥ 100 (capped, 4 of 4)'
        >>> psnr_text({"psnr_mean": 20.0, "psnr_low": 18.0, "psnr_high": 22.0, "psnr_capped": 1, "images": 3})
        '20.0 [18.0, 22.0]; ≥ 100 (capped, 1 of 3)'
    """
    measured = _cell({**row, "seeds": 1, "psnr_std": None}, "psnr", 1) if row["psnr_mean"] is not None else ""
    capped = row.get("psnr_capped") or 0
    if not capped:
        return measured or "–"
    return "; ".join(t for t in (measured, f"≥ 100 (capped, {capped} of {row['images']})") if t)


def _epsilon(row: Mapping[str, Any], bound: float) -> str:
    """ε with a warning mark above ``bound``: beyond it the guarantee means little."""
    text = _cell(row, "epsilon", 2)
    return text + " ⚠" if row["epsilon_mean"] is not None and row["epsilon_mean"] > bound else text


def _broken_note(rows: Sequence[Mapping[str, Any]], threat_model: str, server: str, bar: float | None) -> str:
    """Whether ``server``'s attacks break the undefended model under ``threat_model``, in one sentence."""
    broken = breaking_attacks(rows, threat_model, server=server) or []
    who = f"{server[0].upper()}{server[1:]} server: "
    if not broken:
        return (
            f"{who}**{CANNOT_RANK[0].upper() + CANNOT_RANK[1:]}** (no attack recovered {BROKEN_SHARE:.0%} of the "
            f"`{UNDEFENDED}` model's images at SSIM ≥ {bar})."
        )
    names = ", ".join(f"{r['attack']} ({r['success_rate_mean']:.2f})" for r in broken)
    recovered = f"share of images recovered: SSIM ≥ {bar}, beyond colour and guess"
    return f"{who}The undefended model is broken here ({recovered}): {names}."


def rank_note(rows: Sequence[Mapping[str, Any]], threat_model: str) -> str:
    """What a threat model's table and panels say first: per server of :data:`SERVERS` whose attacks ran there,
    whether they break the undefended model (else :data:`CANNOT_RANK`), and what guessing (the prior-only rows)
    scores against the success bar."""
    bar = _success_bar(rows)
    if breaking_attacks(rows, threat_model) is None:
        note = NO_UNDEFENDED + "."
    else:
        note = " ".join(_broken_note(rows, threat_model, server, bar) for server in attack_servers(rows, threat_model))
    guess = _guessing(rows, threat_model)
    if guess is not None:
        note += (
            f" Guessing from public data ({guess['attack']}, never reads the update) scores SSIM "
            f"{_cell(guess, 'ssim', 3)}, PSNR {psnr_text(guess)} dB"
        )
        if (guess.get("success_rate_mean") or 0.0) > 0:
            note += (
                f", and reaches the success bar on {guess['success_rate_mean']:.0%} of the images: at SSIM ≥ {bar} "
                "the bar alone does not tell an attack from a guess on this data, so an attack's image counts as "
                "recovered only where it also beats every guess of that image"
            )
        note += "."
    return note


def write_markdown(
    rows: Sequence[Mapping[str, Any]], path: Path, *, command: str, epsilon_bound: float, title: str = ""
) -> Path:
    """``bench.md``: the utility of each defence (mean ± std over seeds), then one attack table per threat model
    (the mean and 95 % bootstrap interval over the attacked images), each opened by :func:`rank_note` and followed
    by its ReRo bounds and its by-round table where it has them, with the command that made them."""
    lines = [f"Made by `{command}`" + (f" ({title})." if title else "."), ""]
    lines += ["| defence | strength | test acc. | ε | rounds |", "|---|---|---|---|---|"]
    for defence in dict.fromkeys(r["defence"] for r in rows):
        r = next(r for r in rows if r["defence"] == defence)
        lines.append(
            f"| {_family(r)} | {_strength(r)} | {_cell(r, 'test_accuracy', 3)} | {_epsilon(r, epsilon_bound)} | "
            f"{r['utility_rounds'] if r['utility_rounds'] is not None else '–'} |"
        )
    lines += _tuning_lines(rows)
    header = "| defence | attack | server | strength | test acc. | ε | PSNR (dB) | SSIM | LPIPS | label acc. | exact "
    header += "| success | images | status |"
    for threat_model in dict.fromkeys(r["threat_model"] for r in rows):
        chosen = [r for r in rows if r["threat_model"] == threat_model]
        lines += [
            "",
            f"Threat model `{threat_model}` (leak point {chosen[0]['leak_point']}):",
            "",
            rank_note(rows, threat_model),
            "",
            header,
            "|" + "---|" * 14,
        ]
        for r in chosen:
            values = [_cell(r, "test_accuracy", 3), _epsilon(r, epsilon_bound), psnr_text(r)]
            values += [_cell(r, v, d) for v, d in (("ssim", 3), ("lpips", 3), ("label_accuracy", 2))]
            values += [_cell(r, "exact", 2), _cell(r, "success_rate", 2), str(r.get("images", "–")), r["status"]]
            lines.append(
                f"| {_family(r)} | {_attack_label(r, server=False)} | {r['server']} | {_strength(r)} | "
                + " | ".join(values)
                + " |"
            )
        lines += _bound_lines(rows, threat_model)
        lines += _round_lines(rows, threat_model)
    seeds = ", ".join(str(n) for n in sorted({r["seeds"] for r in rows}))  # how many, not which ("[1]": seed 1?)
    lines += [
        "",
        f"Seeds per cell: {seeds}. Test accuracy and ε: the defence's utility run (the config's data, model and loop "
        "settings), mean ± std over seeds; the attack scores: its short attack runs, the mean over the attacked images "
        f"(images: how many, all seeds together) and its 95 % interval, bootstrapped over the images ({_RESAMPLES} "
        "resamples, seed 0). PSNR: mean over the images whose PSNR is measured; '≥ 100 (capped, k of n)': k images "
        "copied exactly (MSE 0, reported at the 100 dB cap), not averaged. Success: share of the attacked images at "
        "SSIM ≥ the config's success_ssim that also beat a flat image of their own mean colour and, for an attack "
        "that reads the update, every prior-only guess of the same image; an attack breaks a model when its success "
        "is ≥ "
        f"{BROKEN_SHARE:g}. prior_* rows (prior only): guesses from the attacker's public data (the test split) "
        "that never read the images, the level an attack must beat. Exact: share of the images behind an attacked "
        "update recovered at PSNR ≥ 30 dB (mean ± std over seeds). Server: honest-but-curious (reads what it "
        "receives) or malicious (changed the model it ships, e.g. Robbing the Fed's imprint). "
        f"⚠: ε > {epsilon_bound:g} (epsilon_bound), a guarantee too weak to mean much.",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _family(row: Mapping[str, Any]) -> str:
    """The defence a row's strength variant belongs to (the row's defence when it has no strength axis)."""
    return row.get("family") or row["defence"]


def _tuning_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Under the utility table: the settings each tuned defence chose on the validation split (seed 0's)."""
    lines = []
    for defence in dict.fromkeys(r["defence"] for r in rows):
        tuned = next(r for r in rows if r["defence"] == defence).get("tuned")
        if tuned:
            best = max(t["val_accuracy"] for t in tuned["trials"])
            chosen = ", ".join(f"{k} = {v}" for k, v in tuned["chosen"].items())
            lines.append(f"- {defence}: {chosen} (validation accuracy {best:.3f}, best of {len(tuned['trials'])})")
    return ["", "Tuned on the clients' validation split (`tune:`), never the test set:", *lines] if lines else []


def _bound_lines(rows: Sequence[Mapping[str, Any]], threat_model: str) -> list[str]:
    """The DP-SGD points of a threat model's table with their ReRo bounds, one line each (none without)."""
    best = _bounded(rows, threat_model)
    if not best:
        return []
    kappa = best[0]["rero_kappa"]
    lines = ["", f"ReRo bounds (Hayes et al., 2023) at κ = {kappa:.3f} (the prior's success, upper 95 %):"]
    for r in best:
        training = r.get("rero_bound_training")
        lines.append(
            f"- {_family(r)} {_strength(r)}: {r['attack']} succeeds on {_cell(r, 'success_rate', 2)} of the images; "
            f"no attack can exceed {r['rero_bound']:.3f} on the release it saw"
            + (f", {training:.3f} on the utility run's whole DP-SGD" if training is not None else "")
            + ("" if r["success_rate_mean"] <= r["rero_bound"] else " (**measured above the bound: check κ**)")
            + "."
        )
    return lines


def _strength(row: Mapping[str, Any]) -> str:
    """A row's value on its defence's strength axis, "–" for a defence without one."""
    value = row.get("strength")
    return "–" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _attack_label(row: Mapping[str, Any], *, server: bool = True) -> str:
    """An attack's name in tables and plots, with (``server``) its threat model when the server is malicious and a
    mark on a prior-only baseline and on an attack that ran on a model of its own."""
    suffix = ", malicious server" if server and _server(row) == SERVERS[1] else ""
    marks = " (prior only)" if row.get("prior_only") else " (own model)" if row.get("own_model") else ""
    return row["attack"] + suffix + marks


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points ``(attack score, accuracy)`` that no other point beats on both (a lower attack score,
    a higher accuracy), ordered by attack score.

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


FIGURE_WIDTH = 16.0
"""Inches; at :data:`_DPI` every figure is 1600 px wide, two panels a line at most."""
_DPI = 100
_FONT = 10
_CURVE_COLOURS = tuple(f"C{k}" for k in range(10) if k != 3)
"""One colour per defence curve; not C3 (red), which marks ε above the bound and the success bar."""


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _panels(count: int, height: float, *, extra: float = 0.0) -> tuple[Any, list[Any]]:
    """A 1600 px wide figure with ``count`` panels, at most two a line, each ``height`` inches tall, and ``extra``
    inches below them (a colour bar)."""
    columns = min(2, count)
    lines = math.ceil(count / columns)
    fig = _figure(FIGURE_WIDTH, height * lines + extra)
    axes = list(fig.subplots(lines, columns, squeeze=False).ravel())
    for ax in axes[count:]:
        ax.set_visible(False)
    return fig, axes[:count]


def _strongest(
    rows: Sequence[Mapping[str, Any]], threat_model: str, server: str | None = None
) -> list[Mapping[str, Any]]:
    """Per defence, its row of the attack with the highest mean SSIM under ``threat_model`` (prior-only rows are
    the guessing level, not an attack; an attack on a model of its own says nothing of the defence's model), among
    rows with an SSIM and a test accuracy, and among ``server``'s attacks when given."""
    best = []
    for defence in dict.fromkeys(r["defence"] for r in rows):
        scored = [r for r in rows if (r["defence"], r["threat_model"]) == (defence, threat_model)]
        scored = [r for r in scored if not r.get("prior_only") and not r.get("own_model")]
        scored = [r for r in scored if server is None or _server(r) == server]
        scored = [r for r in scored if r["ssim_mean"] is not None and r["test_accuracy_mean"] is not None]
        if scored:
            best.append(max(scored, key=lambda r: r["ssim_mean"]))
    return best


def _error(row: Mapping[str, Any], value: str) -> list[list[float]]:
    """Asymmetric error bar (matplotlib's ``[[below], [above]]``) of a value's 95 % interval."""
    mean, low, high = row[f"{value}_mean"], row.get(f"{value}_low"), row.get(f"{value}_high")
    return [[mean - low if low is not None else 0.0], [high - mean if high is not None else 0.0]]


def privacy_curves(
    rows: Sequence[Mapping[str, Any]], threat_model: str, server: str | None = None
) -> dict[str, list[Mapping[str, Any]]]:
    """The points of :func:`write_scatter`'s panel for ``threat_model`` (and ``server``, when given): per defence
    family, the row of the strongest attack on each of its strengths (highest mean SSIM, prior-only rows excluded),
    ordered along the strength axis; a defence without an axis is a family of one point.

    Example:
        >>> rows = [{"defence": f"p@{v}", "family": "p", "strength": v, "threat_model": "t", "attack": "ig",
        ...          "ssim_mean": 1 - v, "test_accuracy_mean": 0.9} for v in (0.9, 0.5)]
        >>> [r["strength"] for r in privacy_curves(rows, "t")["p"]]
        [0.5, 0.9]
    """
    families: dict[str, list[Mapping[str, Any]]] = {}
    for r in _strongest(rows, threat_model, server):
        families.setdefault(_family(r), []).append(r)
    for points in families.values():
        points.sort(key=lambda r: (str(type(r.get("strength"))), r.get("strength") or 0))
    return families


def _privacy_panel(
    ax: Any, rows: Sequence[Mapping[str, Any]], threat_model: str, epsilon_bound: float, server: str = SERVERS[0]
) -> list[Mapping[str, Any]]:
    """Draw the panel of :func:`write_scatter` for ``threat_model`` and ``server``'s attacks on ``ax``; returns the
    rows of its Pareto front."""
    unreadable = [r["defence"] for r in rows if r["threat_model"] == threat_model and "readable" in r["status"]]
    curves = privacy_curves(rows, threat_model, server)
    best = [r for points in curves.values() for r in points]
    points = [(r["ssim_mean"], r["test_accuracy_mean"]) for r in best]
    broken = breaking_attacks(rows, threat_model, server=server)
    front = pareto_front(points) if broken else []  # no front over attacks that failed on the undefended model
    families: dict[str, list[int]] = {}  # indices into best, per curve
    for i, r in enumerate(best):
        families.setdefault(_family(r), []).append(i)
    colours = [_CURVE_COLOURS[k % len(_CURVE_COLOURS)] for k in range(len(families))]
    for colour, indices in zip(colours, families.values(), strict=True):
        if len(indices) > 1:  # a defence swept over its strength: one curve, one point per strength
            ax.plot(*zip(*(points[i] for i in indices), strict=True), "-", color=colour, lw=1.2, alpha=0.8)
        for i in indices:
            r = best[i]
            warn = r["epsilon_mean"] is not None and r["epsilon_mean"] > epsilon_bound
            ax.errorbar(
                *points[i],
                xerr=_error(r, "ssim"),
                yerr=r["test_accuracy_std"] or 0.0,
                marker="o",
                color=colour,
                markeredgecolor="tab:red" if warn else colour,
                linestyle="none",
                capsize=3,
                markerfacecolor="white" if i not in front else None,
            )
            if r.get("strength") is not None:  # the point's strength (and ε) beside it
                text = _strength(r) + (f", ε={r['epsilon_mean']:.3g}" if r["epsilon_mean"] is not None else "")
                ax.annotate(
                    text + (" ⚠" if warn else ""),
                    xy=points[i],
                    xytext=(4, 4),
                    textcoords="offset points",
                    fontsize=_FONT - 3,
                    color=colour,
                )
    if len(front) > 1:
        ax.plot(*zip(*(points[i] for i in front), strict=True), "--", color="grey", label="Pareto front")
    bar = _success_bar(rows)
    if bar is not None:
        ax.axvline(bar, color="tab:red", linestyle="--", lw=1.2, label=f"success bar: SSIM ≥ {bar:g}")
    guess = _guessing(rows, threat_model)
    if guess is not None:
        ax.axvline(guess["ssim_mean"], color="0.35", linestyle=":", lw=1.5, label=f"guessing ({guess['attack']})")
    heading = f"threat model {threat_model} ({best[0]['leak_point'] if best else 'no scores'}), {server} server"
    if broken is None or not broken:  # said where the eye starts, in the panel's title
        heading += "\n" + (NO_UNDEFENDED if broken is None else CANNOT_RANK).replace(": ", ":\n", 1)
    if unreadable:  # no reconstruction to score, so no point: the server read only ciphertexts
        heading += "\nnothing readable (no point): " + ", ".join(dict.fromkeys(unreadable))
    ax.set_title(heading, fontsize=_FONT + 1, color="black" if broken else "darkred", loc="left")
    anchors = [max(indices, key=lambda i: points[i][1]) for indices in families.values()]  # a label per defence
    order = sorted(range(len(anchors)), key=lambda k: points[anchors[k]][1])
    heights = _spread([points[anchors[k]][1] for k in order], gap=0.075, low=0.0, high=1.0)
    for k, height in zip(order, heights, strict=True):
        indices = list(families.values())[k]
        r = best[anchors[k]]
        attacks = ", ".join(dict.fromkeys(_attack_label(best[i], server=False) for i in indices))
        label = f"{_family(r)} ({attacks})"
        if len(indices) == 1 and r["epsilon_mean"] is not None and r.get("strength") is None:
            label += f" ε={r['epsilon_mean']:.3g}" + (" ⚠" if r["epsilon_mean"] > epsilon_bound else "")
        if len(indices) > 1:
            label += f", {len(indices)} strengths"
        ax.annotate(
            label,
            xy=points[anchors[k]],
            xytext=(1.02, height),
            textcoords=("axes fraction", "data"),
            fontsize=_FONT - 1.5,
            va="center",
            color=colours[k],
            arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.6},
        )
    ax.set_xlabel("SSIM of the strongest attack (95 % interval over images)", fontsize=_FONT)
    ax.set_ylabel("test accuracy (utility run)", fontsize=_FONT)
    ax.set_xlim(min([-0.02, *(x - 0.05 for x, _ in points)]), 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.tick_params(labelsize=_FONT - 1)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[1]:  # a panel with no scores and no bar has nothing to list
        ax.legend(fontsize=_FONT - 2, loc="lower right")  # lower left holds the defences that leave no model
    return [best[i] for i in front]


def write_scatter(
    rows: Sequence[Mapping[str, Any]], path: Path, *, epsilon_bound: float = 10.0, title: str = ""
) -> Path:
    """Privacy–utility panels, one per threat model and server of :data:`SERVERS` whose attacks ran there (two a
    line, 1600 px wide): each defence's test accuracy (its utility run; error bar: std over seeds) against the SSIM
    of that server's strongest attack on it under that threat model (error bar: its 95 % interval over images); an
    honest-but-curious panel never shows a malicious server's score, which no reading of the updates alone reaches.
    A defence swept over its strength (:func:`~lightning_fl.bench.grid.expand_strengths`) is one curve of one
    colour, a point per strength, each labelled with its strength and ε; the Pareto front runs over all points of
    all curves.

    Up and to the left is better (high accuracy, poor reconstructions). Each panel draws the success bar
    (``success_ssim``) and the guessing level (the best prior-only row) on the privacy axis. Where an attack of the
    panel's server breaks the undefended model (:func:`breaking_attacks`), the Pareto front (no other defence has
    both a lower attack SSIM and a higher accuracy) is the dashed line; where none does, the panel says
    :data:`CANNOT_RANK` and draws no front. Labels sit in a column beside the panel, spread so that they never
    overlap, with a line to their point; ε above ``epsilon_bound`` is marked ⚠. ``title`` (preset, budget, seeds)
    heads the figure.
    """
    panels = [(t, s) for t in dict.fromkeys(r["threat_model"] for r in rows) for s in attack_servers(rows, t)]
    fig, axes = _panels(len(panels), 5.6)
    for ax, (threat_model, server) in zip(axes, panels, strict=True):
        _privacy_panel(ax, rows, threat_model, epsilon_bound, server)
    head = f"privacy–utility per threat model{': ' + title if title else ''}"
    fig.suptitle(f"{head}\nfilled: Pareto front; red edge ⚠: ε > {epsilon_bound:g}", fontsize=_FONT + 2)
    fig.savefig(path, dpi=_DPI)
    return path


def _bounded(rows: Sequence[Mapping[str, Any]], threat_model: str) -> list[Mapping[str, Any]]:
    """Per DP-SGD defence with a bound under ``threat_model``, its row of the attack with the highest success."""
    best = []
    for defence in dict.fromkeys(r["defence"] for r in rows):
        scored = [r for r in rows if (r["defence"], r["threat_model"]) == (defence, threat_model)]
        scored = [r for r in scored if not r.get("prior_only") and r.get("rero_bound") is not None]
        scored = [r for r in scored if r.get("success_rate_mean") is not None]
        if scored:
            best.append(max(scored, key=lambda r: r["success_rate_mean"]))
    return best


def write_bounds(rows: Sequence[Mapping[str, Any]], path: Path, *, title: str = "") -> Path | None:
    """The measured attack success of every DP-SGD point beside its ReRo upper bound (``reconstruction_bound.png``),
    one panel per threat model (two a line, 1600 px wide), or ``None`` when no row has a bound.

    Per point: the success of the strongest attack (share of images at the success bar; bar: 95 % interval over
    images), the bound for the release that attack saw (▼; the measurement must lie under it) and the bound for the
    utility run's whole DP-SGD (×), both at the threat model's κ (:func:`prior_success`, dotted line).
    """
    threat_models = [t for t in dict.fromkeys(r["threat_model"] for r in rows) if _bounded(rows, t)]
    if not threat_models:
        return None
    fig, axes = _panels(len(threat_models), 4.6)
    for ax, threat_model in zip(axes, threat_models, strict=True):
        best = _bounded(rows, threat_model)
        xs = range(len(best))
        for x, r in zip(xs, best, strict=True):
            first = x == 0  # one legend entry per kind
            ax.errorbar(
                x,
                r["success_rate_mean"],
                yerr=_error(r, "success_rate"),
                marker="o",
                color="tab:blue",
                capsize=3,
                label="measured (strongest attack)" if first else None,
            )
            label = "ReRo bound, attacked release" if first else None
            ax.plot(x, r["rero_bound"], "v", color="black", ms=9, label=label)
            if r.get("rero_bound_training") is not None:
                label = "ReRo bound, utility run (σ, q, T)" if first else None
                ax.plot(x, r["rero_bound_training"], "x", color="0.4", ms=8, label=label)
            gap = f"{r['rero_bound'] - r['success_rate_mean']:+.2f}"
            ax.annotate(gap, (x, r["rero_bound"]), xytext=(6, -3), textcoords="offset points", fontsize=_FONT - 2)
        ax.axhline(best[0]["rero_kappa"], color="0.35", linestyle=":", lw=1.2, label="κ (prior's success, upper 95 %)")
        ax.set_xlim(-0.5, len(best) - 0.5)
        labels = [f"{_family(r)}\n{_strength(r)}\n({r['attack']})" for r in best]
        ax.set_xticks(list(xs), labels, fontsize=_FONT - 2)
        ax.set_ylim(-0.02, 1.05)
        ax.set_ylabel(f"attack success (SSIM ≥ {_success_bar(rows)})", fontsize=_FONT)
        heading = f"threat model {threat_model}: measured vs. upper bound (numbers: bound − measured)"
        ax.set_title(heading, fontsize=_FONT)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=_FONT - 2, loc="upper right")
    head = "reconstruction success of DP-SGD points and its ReRo bound (Hayes et al., 2023)"
    fig.suptitle(f"{head}{': ' + title if title else ''}", fontsize=_FONT + 2)
    fig.savefig(path, dpi=_DPI)
    return path


def leakage_by_round(
    rows: Sequence[Mapping[str, Any]], threat_model: str, *, guess: bool = False
) -> dict[str, list[tuple[int, float, float, float]]]:
    """Per defence, the strongest attack's SSIM at each attacked round under ``threat_model``: ``(round, mean, low,
    high)`` with the 95 % bootstrap interval over the round's images; only defences attacked at two rounds or more.

    The strongest attack is the one with the highest mean SSIM over all rounds among the attacks (``guess``: among
    the prior-only guesses, the level an attack is read against; docs/bench.md, "Reading the tables").

    Example:
        >>> row = {"defence": "none", "threat_model": "t", "attack": "ig", "ssim_mean": 0.5,
        ...        "by_round": {0: [0.9, 0.9], 24: [0.2, 0.2]}}
        >>> [(r, round(m, 2)) for r, m, _, _ in leakage_by_round([row], "t")["none"]]
        [(0, 0.9), (24, 0.2)]
        >>> leakage_by_round([row], "t", guess=True)
        {}
    """
    from lightning_fl.attacks.metrics import bootstrap_interval

    lines = {}
    for defence in dict.fromkeys(r["defence"] for r in rows):
        best = _round_row(rows, defence, threat_model, guess=guess)
        if best is not None:
            points = [(k, v) for k, v in best["by_round"].items() if v]
            lines[defence] = [(k, *bootstrap_interval(v, resamples=_RESAMPLES)) for k, v in points]
    return lines


def _round_row(
    rows: Sequence[Mapping[str, Any]], defence: str, threat_model: str, *, guess: bool
) -> Mapping[str, Any] | None:
    """A defence's row that :func:`leakage_by_round` draws: among its rows attacked at two rounds or more, the attack
    (``guess``: the prior-only guess) with the highest mean SSIM; ``None`` without one."""
    scored = [r for r in rows if (r["defence"], r["threat_model"]) == (defence, threat_model)]
    scored = [r for r in scored if bool(r.get("prior_only")) == guess and len(r.get("by_round") or {}) > 1]
    return max(scored, key=lambda r: r.get("ssim_mean") or 0.0) if scored else None


def _round_lines(rows: Sequence[Mapping[str, Any]], threat_model: str) -> list[str]:
    """The by-round table of a threat model attacked at two rounds or more (what ``leakage_by_round.png`` draws):
    per defence, its strongest attack's and its best guess's SSIM at each round, mean [95 % interval] (n images)."""
    lines = {guess: leakage_by_round(rows, threat_model, guess=guess) for guess in (False, True)}
    rounds = sorted({k for drawn in lines.values() for points in drawn.values() for k, *_ in points})
    if not rounds:
        return []
    table = [
        "",
        "SSIM by training round (the strongest attack, then the best prior-only guess on the same images): mean "
        "[95 % interval over the images]:",
        "",
        "| defence | attack | " + " | ".join(f"round {k}" for k in rounds) + " |",
        "|---|---|" + "---|" * len(rounds),
    ]
    for defence in dict.fromkeys(r["defence"] for r in rows):
        for guess in (False, True):
            row, points = _round_row(rows, defence, threat_model, guess=guess), lines[guess].get(defence)
            if row is None or not points:
                continue
            at = {k: f"{m:.3f} [{lo:.3f}, {hi:.3f}] ({len(row['by_round'][k])})" for k, m, lo, hi in points}
            cells = " | ".join(at.get(k, "–") for k in rounds)
            label = f"{row['attack']} (guess)" if guess else row["attack"]
            table.append(f"| {defence} | {label} | {cells} |")
    return table


def write_leakage_by_round(rows: Sequence[Mapping[str, Any]], path: Path, *, title: str = "") -> Path | None:
    """Attack SSIM against the training round (``leakage_by_round.png``), one panel per threat model that attacks
    two rounds or more (a ``protocol: utility`` threat model: the utility run's own updates), one line per defence
    (:func:`leakage_by_round`, band: 95 % interval over images) and, dotted in its colour, the defence's prior-only
    guess on the same images (bars: its 95 % interval); ``None`` when no threat model does."""
    threat_models = [t for t in dict.fromkeys(r["threat_model"] for r in rows) if leakage_by_round(rows, t)]
    if not threat_models:
        return None
    fig, axes = _panels(len(threat_models), 5.0)
    families = list(dict.fromkeys(_family(r) for r in rows))
    for ax, threat_model in zip(axes, threat_models, strict=True):
        drawn: list[str] = []  # a family's strengths: one colour, one line style each
        guesses = leakage_by_round(rows, threat_model, guess=True)
        for defence, points in leakage_by_round(rows, threat_model).items():
            row = next(r for r in rows if r["defence"] == defence)
            colour = _CURVE_COLOURS[families.index(_family(row)) % len(_CURVE_COLOURS)]
            style = ("-", "--", ":", "-.")[drawn.count(_family(row)) % 4]
            drawn.append(_family(row))
            rounds, means, lows, highs = zip(*points, strict=True)
            ax.plot(rounds, means, marker="o", linestyle=style, color=colour, label=defence, lw=1.2, ms=4)
            ax.fill_between(rounds, lows, highs, color=colour, alpha=0.12)
            guessed = guesses.get(defence)
            if guessed:  # the prior-only guess on the same images: an attack under it recovered nothing
                rounds, means, lows, highs = zip(*guessed, strict=True)
                ax.errorbar(
                    rounds,
                    means,
                    yerr=[
                        [m - lo for m, lo in zip(means, lows, strict=True)],
                        [h - m for m, h in zip(means, highs, strict=True)],
                    ],
                    marker="x",
                    linestyle=":",
                    color=colour,
                    label=f"{defence}: guess (prior only)",
                    lw=1.0,
                    ms=5,
                    capsize=2,
                    alpha=0.8,
                )
        bar = _success_bar(rows)
        if bar is not None:
            ax.axhline(bar, color="tab:red", linestyle="--", lw=1.2, label=f"success bar: SSIM ≥ {bar:g}")
        ax.set_title(f"threat model {threat_model}: leakage over training", fontsize=_FONT + 1)
        ax.set_xlabel("training round (0-based) of the attacked update", fontsize=_FONT)
        ax.set_ylabel("SSIM of the strongest attack", fontsize=_FONT)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=_FONT - 3, loc="center left", bbox_to_anchor=(1.01, 0.5), ncol=1 + len(ax.lines) // 16)
    fig.suptitle(f"attack score by training round{': ' + title if title else ''}", fontsize=_FONT + 2)
    fig.savefig(path, dpi=_DPI)
    return path


def write_heatmap(rows: Sequence[Mapping[str, Any]], path: Path, *, title: str = "") -> Path:
    """Attack success heatmap: attacks × defences, the success rate in each cell; one panel per threat model, two a
    line, 1600 px wide; ``title`` (preset, budget, seeds) heads the figure."""
    threat_models = list(dict.fromkeys(r["threat_model"] for r in rows))
    attacks = list(dict.fromkeys(_attack_label(r) for r in rows))
    defences = list(dict.fromkeys(r["defence"] for r in rows))
    fig, axes = _panels(len(threat_models), 0.42 * len(attacks) + 0.09 * max(len(d) for d in defences) + 1.2, extra=0.8)
    image = None
    for ax, threat_model in zip(axes, threat_models, strict=True):
        grid = [[math.nan] * len(defences) for _ in attacks]
        for r in rows:
            if r["threat_model"] == threat_model and r["success_rate_mean"] is not None:
                grid[attacks.index(_attack_label(r))][defences.index(r["defence"])] = r["success_rate_mean"]
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="Reds", aspect="auto")
        for a, line in enumerate(grid):
            for d, value in enumerate(line):
                colour = "white" if value > 0.6 else "black"  # readable on dark cells; NaN compares False
                text = "" if math.isnan(value) else f"{value:.2f}"
                ax.text(d, a, text, ha="center", va="center", fontsize=_FONT - 2, color=colour)
        ax.set_xticks(range(len(defences)), defences, rotation=50, ha="right", fontsize=_FONT - 1)
        ax.set_yticks(range(len(attacks)), attacks, fontsize=_FONT - 1)
        unbroken = [s for s in attack_servers(rows, threat_model) if not breaking_attacks(rows, threat_model, server=s)]
        note = f" (cannot rank for the {' or '.join(unbroken)} server: undefended model not broken)" if unbroken else ""
        ax.set_title(threat_model + note, fontsize=_FONT)
    if image is not None:
        bar = fig.colorbar(image, ax=axes, location="bottom", shrink=0.5, aspect=40)
        bar.set_label("attack success rate (share of images; empty: not run)", fontsize=_FONT)
        bar.ax.xaxis.set_label_position("top")  # above the bar: constrained layout leaves no room below it
    fig.suptitle(f"attack success per threat model{': ' + title if title else ''}", fontsize=_FONT + 2)
    fig.savefig(path, dpi=_DPI)
    return path


def log_to_wandb(
    rows: Sequence[Mapping[str, Any]],
    pictures: Sequence[Path],
    *,
    project: str,
    output_dir: Path,
    config: Mapping[str, Any] | None = None,
) -> None:
    """The table as a W&B Table and the two PNGs as images, in one (offline by default) W&B run whose
    ``wandb.config`` holds ``config`` (the bench's settings; values W&B cannot store are written as text)."""
    import json
    import os

    import wandb

    run = wandb.init(
        project=project,
        dir=str(output_dir),
        mode=os.environ.get("WANDB_MODE", "offline"),
        job_type="bench",
        config=json.loads(json.dumps(dict(config or {}), default=str)),
    )
    run.log(
        {
            "bench": wandb.Table(columns=list(COLUMNS), data=[[r.get(c) for c in COLUMNS] for r in rows]),
            **{p.stem: wandb.Image(str(p)) for p in pictures},
        }
    )
    run.finish()
