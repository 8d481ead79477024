"""The bench's report on hand-made cells: intervals over images, capped PSNRs, "cannot rank", legible panels."""

from __future__ import annotations

import csv

import pytest
from PIL import Image

from lightning_fl.attacks.metrics import bootstrap_interval
from lightning_fl.bench import report

_BAR = 0.5


def _cell(
    defence: str,
    attack: str,
    threat_model: str,
    *,
    psnr: list[float],
    ssim: list[float],
    seed: int = 0,
    prior_only: bool = False,
) -> dict:
    success = [float(v >= _BAR) for v in ssim]
    return {
        "defence": defence, "attack": attack, "threat_model": threat_model, "seed": seed, "leak_point": "client_update",
        "server": "honest-but-curious", "psnr": sum(psnr) / len(psnr), "ssim": sum(ssim) / len(ssim), "lpips": None,
        "label_accuracy": 1.0, "exact": 0.0, "success_rate": sum(success) / len(success), "success_ssim": _BAR,
        "images": {"psnr": psnr, "ssim": ssim, "lpips": None}, "prior_only": prior_only, "status": "ok",
        "cpu_seconds": 1.0,
    }  # fmt: skip


def _utility(*defences: str, seeds: tuple[int, ...] = (0,)) -> dict:
    return {
        f"{d}__s{s}": {"test_accuracy": 0.9 - 0.1 * i, "epsilon": None, "rounds": 2, "status": "ok"}
        for i, d in enumerate(defences)
        for s in seeds
    }


def _rows(cells: list[dict], *defences: str, seeds: tuple[int, ...] = (0,)) -> list[dict]:
    return report.summarise(cells, _utility(*defences, seeds=seeds))


def test_a_row_gives_the_mean_and_bootstrap_interval_over_the_images_of_all_its_seeds(tmp_path) -> None:
    cells = [
        _cell("none", "ig", "b8", psnr=[20.0, 22.0, 24.0], ssim=[0.6, 0.7, 0.8], seed=0),
        _cell("none", "ig", "b8", psnr=[30.0, 26.0], ssim=[0.9, 0.2], seed=1),
    ]
    (row,) = _rows(cells, "none", seeds=(0, 1))
    ssims = [0.6, 0.7, 0.8, 0.9, 0.2]
    assert row["images"] == 5 and row["seeds"] == 2
    assert (row["ssim_mean"], row["ssim_low"], row["ssim_high"]) == pytest.approx(bootstrap_interval(ssims))
    assert row["ssim_low"] < row["ssim_mean"] < row["ssim_high"]
    assert row["psnr_mean"] == pytest.approx(24.4) and row["success_rate_mean"] == pytest.approx(0.8)
    assert row["success_rate_low"] < 0.8 <= row["success_rate_high"] <= 1.0
    report.write_markdown([row], tmp_path / "bench.md", command="x", epsilon_bound=10.0)
    line = next(li for li in (tmp_path / "bench.md").read_text().splitlines() if li.startswith("| none | ig"))
    assert f"{row['ssim_mean']:.3f} [{row['ssim_low']:.3f}, {row['ssim_high']:.3f}]" in line and "| 5 |" in line
    report.write_csv([row], tmp_path / "bench.csv")
    (stored,) = csv.DictReader((tmp_path / "bench.csv").open())
    assert float(stored["ssim_low"]) == pytest.approx(row["ssim_low"]) and stored["images"] == "5"


def test_capped_psnrs_are_counted_apart_and_not_averaged(tmp_path) -> None:
    cells = [
        _cell("none", "rtf", "b4", psnr=[100.0, 100.0, 100.0, 100.0], ssim=[1.0] * 4),
        _cell("none", "ig", "b4", psnr=[100.0, 20.0, 22.0], ssim=[1.0, 0.6, 0.7]),
    ]
    copied, mixed = _rows(cells, "none")
    assert copied["psnr_mean"] is None and copied["psnr_capped"] == 4
    assert report.psnr_text(copied) == "≥ 100 (capped, 4 of 4)"
    assert mixed["psnr_mean"] == pytest.approx(21.0) and mixed["psnr_capped"] == 1  # the mean of the measured two
    assert report.psnr_text(mixed).endswith("; ≥ 100 (capped, 1 of 3)")
    report.write_markdown([copied, mixed], tmp_path / "bench.md", command="x", epsilon_bound=10.0)
    assert "≥ 100 (capped, 4 of 4)" in (tmp_path / "bench.md").read_text()


def _grid(threat_models: list[str], *, broken: set[str]) -> list[dict]:
    """Three defences and two attacks plus a prior-only row; the attacks break `none` only under `broken`."""
    cells = []
    for t in threat_models:
        for d, strength in (("none", 1.0), ("noise", 0.6), ("pruning", 0.3)):
            for a, scale in (("dlg", 1.0), ("ig", 0.8)):
                s = min(0.95, (0.9 if t in broken else 0.35) * strength * scale + 0.05)
                cells.append(_cell(d, a, t, psnr=[10 + 20 * s, 12 + 20 * s], ssim=[s, s - 0.04]))
            cells.append(_cell(d, "prior_class", t, psnr=[13.0, 14.0], ssim=[0.3, 0.25], prior_only=True))
    return cells


def test_a_threat_model_whose_undefended_row_is_not_broken_says_it_cannot_rank_and_draws_no_front(tmp_path) -> None:
    from matplotlib.figure import Figure

    rows = _rows(_grid(["weak", "strong"], broken={"strong"}), "none", "noise", "pruning")
    assert report.breaking_attacks(rows, "weak") == [] and len(report.breaking_attacks(rows, "strong")) == 2
    fronts, texts, legends = {}, {}, {}
    for t in ("weak", "strong"):
        ax = Figure().subplots()
        fronts[t] = report._privacy_panel(ax, rows, t, 10.0)
        texts[t] = " ".join([ax.get_title(loc="left"), *(x.get_text() for x in ax.texts)]).replace("\n", " ")
        legends[t] = ax.get_legend_handles_labels()[1]
    assert fronts["weak"] == [] and "Pareto front" not in legends["weak"] and report.CANNOT_RANK in texts["weak"]
    assert (
        len(fronts["strong"]) >= 2 and "Pareto front" in legends["strong"] and report.CANNOT_RANK not in texts["strong"]
    )
    for t in ("weak", "strong"):  # the success bar and the guessing level on every panel's privacy axis
        assert "success bar: SSIM ≥ 0.5" in legends[t] and "guessing (prior_class)" in legends[t]
    report.write_markdown(rows, tmp_path / "bench.md", command="x", epsilon_bound=10.0)
    sections = (tmp_path / "bench.md").read_text().split("Threat model `")
    weak, strong = (next(s for s in sections if s.startswith(t)) for t in ("weak", "strong"))
    assert "No attack broke the undefended model here: this threat model cannot rank defences" in weak
    assert "cannot rank" not in strong and "The undefended model is broken here" in strong
    assert "(prior only)" in weak and "Guessing from public data (prior_class" in weak


def test_figures_are_1600_px_wide_with_at_most_two_panels_a_line(tmp_path) -> None:
    sizes = {}
    for count in (1, 2, 5):
        rows = _rows(_grid([f"t{i}" for i in range(count)], broken={"t0"}), "none", "noise", "pruning")
        for name, write in (("heatmap", report.write_heatmap), ("privacy_utility", report.write_scatter)):
            path = write(rows, tmp_path / f"{name}_{count}.png", title="bench_digits, quick budget, seed 0")
            sizes[name, count] = Image.open(path).size
    for name in ("heatmap", "privacy_utility"):
        assert {sizes[name, c][0] for c in (1, 2, 5)} == {1600}
        assert sizes[name, 2][1] == sizes[name, 1][1]  # two panels share a line
        assert sizes[name, 5][1] > 2.5 * sizes[name, 1][1]  # five take three lines


def test_a_cell_with_nothing_readable_keeps_its_success_rate_of_zero() -> None:
    unreadable = {**_cell("paillier", "ig", "b1", psnr=[1.0], ssim=[0.0]), "psnr": None, "ssim": None}
    unreadable.update(images={"psnr": [], "ssim": [], "lpips": None}, success_rate=0.0, status="ok: nothing readable")
    (row,) = _rows([unreadable], "paillier")
    assert row["images"] == 0 and row["success_rate_mean"] == 0.0 and row["ssim_mean"] is None


def test_a_panel_names_the_defences_with_nothing_readable_in_its_title() -> None:
    """A defence whose update the server cannot read (Paillier) has no point on the panel; the title says so, where
    no point or legend covers it."""
    from matplotlib.figure import Figure

    unreadable = {**_cell("paillier", "ig", "weak", psnr=[1.0], ssim=[0.0]), "psnr": None, "ssim": None}
    unreadable.update(images={"psnr": [], "ssim": [], "lpips": None}, success_rate=0.0, status="ok: nothing readable")
    rows = _rows([*_grid(["weak"], broken={"weak"}), unreadable], "none", "noise", "pruning", "paillier")
    ax = Figure().subplots()
    report._privacy_panel(ax, rows, "weak", 10.0)
    assert "nothing readable (no point): paillier" in ax.get_title(loc="left")
    assert not any("readable" in text.get_text() for text in ax.texts)  # not under the points or the legend


def test_an_attack_on_a_model_of_its_own_neither_breaks_the_undefended_model_nor_is_a_defences_strongest() -> None:
    """The analytic attack runs on its own MLP: its 1.0 says nothing of the defence's model (issue 31's mixed
    scatter), so the panel ranks the attacks that ran on the defence's model, and a threat model broken only by it
    cannot rank."""
    cells = [
        _cell(defence, attack, "t", psnr=[30.0, 30.0], ssim=ssim)
        for defence in ("none", "noise")
        for attack, ssim in (("ig", [0.2, 0.3]), ("analytic", [1.0, 1.0]))
    ]
    attacks = {"ig": {"class_path": "x.IG"}, "analytic": {"class_path": "x.Analytic", "model": {"init_args": {}}}}
    rows = report.summarise(cells, _utility("none", "noise"), attacks=attacks)
    assert [r["own_model"] for r in rows] == [False, True, False, True]
    assert report.breaking_attacks(rows, "t") == []
    assert {r["attack"] for r in report._strongest(rows, "t")} == {"ig"}
    assert report.breaking_attacks(report.summarise(cells, _utility("none", "noise")), "t") != []


def test_each_server_gets_its_own_panel_and_verdict_so_a_malicious_score_never_stands_for_an_honest_one(
    tmp_path,
) -> None:
    """Robbing the Fed (malicious server) copies every image through key-lock, IG (honest-but-curious) none: one
    panel over both would put key-lock at SSIM 1.0 for a reader who asks about the honest-but-curious server, and an
    aggregate broken only by the malicious server would look rankable for the honest one."""
    cells = []
    for t, ig_none in (("b1", [0.9, 0.8]), ("aggregate", [0.3, 0.2])):
        for defence, ig, rtf in (("none", ig_none, [1.0, 1.0]), ("keylock", [0.1, 0.1], [1.0, 1.0])):
            cells.append(_cell(defence, "ig", t, psnr=[20.0, 20.0], ssim=ig))
            cells.append({**_cell(defence, "rtf", t, psnr=[100.0, 100.0], ssim=rtf), "server": "malicious"})
    rows = _rows(cells, "none", "keylock")
    assert report.attack_servers(rows, "b1") == ["honest-but-curious", "malicious"]
    honest = report.privacy_curves(rows, "b1", "honest-but-curious")
    assert honest["keylock"][0]["attack"] == "ig" and honest["keylock"][0]["ssim_mean"] == pytest.approx(0.1)
    assert report.privacy_curves(rows, "b1", "malicious")["keylock"][0]["attack"] == "rtf"
    assert report.breaking_attacks(rows, "aggregate", server="honest-but-curious") == []
    assert [r["attack"] for r in report.breaking_attacks(rows, "aggregate", server="malicious")] == ["rtf"]
    note = report.rank_note(rows, "aggregate")
    assert f"Honest-but-curious server: **{report.CANNOT_RANK[0].upper()}" in note
    assert "Malicious server: The undefended model is broken here" in note and "rtf (1.00)" in note
    two = Image.open(report.write_scatter(rows, tmp_path / "two.png")).size
    one = Image.open(report.write_scatter([r for r in rows if r["attack"] == "ig"], tmp_path / "one.png")).size
    assert two[1] > 1.5 * one[1]  # four panels on two lines, where IG alone gives two on one
