"""``lightning-fl bench``: run every cell of the grid (in parallel, resumably) and write the report.

The unit of work is a federated run: the cells still to run that share a defence, leak point and seed, each attack
a callback of that one run (:func:`~lightning_fl.bench.cell.run_cells`). Worker processes are started once and
kept for the whole grid, so torch and Lightning are imported once per worker, not once per run.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import signal
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from lightning_fl.bench import report
from lightning_fl.bench.cell import failure, run_cells, write_atomically
from lightning_fl.bench.grid import Cell, cells, fingerprint

__all__ = ["run_bench"]


def _run_group(specs: dict[str, dict[str, Any]], output_dir: str) -> dict[str, dict[str, Any]]:
    """One federated run in a worker: its cells' results, or its failure as their status (one failing run never
    stops the grid)."""
    os.environ.setdefault("WANDB_MODE", "offline")
    try:
        return run_cells(specs, Path(output_dir))
    except Exception as err:
        return {name: {"status": failure(err)} for name in specs}


def _worker_signals() -> None:
    """In a worker: Ctrl+C is the main process's to handle (it stops the workers), and SIGTERM is not turned into the
    command's exception, which the pool would survive."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process since it started and of its finished children (the workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _done(path: Path, digest: str) -> dict[str, Any] | None:
    if not path.exists():
        return None
    stored = json.loads(path.read_text())
    return stored if stored.get("fingerprint") == digest else None


def run_bench(
    settings: Mapping[str, Any],
    output_dir: str | Path,
    *,
    jobs: int = 1,
    command: str = "lightning-fl bench",
    wandb_project: str | None = None,
    report_only: bool = False,
    print_: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Run the grid of ``settings`` and write ``bench.csv``, ``bench.md``, ``scatter.png`` and ``heatmap.png``.

    Each finished cell is stored in ``output_dir/cells/<cell>.json`` (written atomically, with a fingerprint of
    its settings); a cell whose file exists with the same fingerprint is not re-run, so an interrupted bench
    continues where it stopped. The cells still to run are grouped into federated runs (one per defence, leak point
    and seed, every attack a callback of it); ``jobs > 1`` runs these in that many worker processes.

    With ``report_only`` nothing runs: the report is written from the cells finished so far (a stopped bench's
    partial table), and the number of cells it lacks is printed.

    Returns:
        the summary rows (one per defence × attack × leak point).
    """
    output_dir = Path(output_dir)
    grid: list[Cell] = cells(settings)
    results: dict[str, dict[str, Any]] = {}
    runs: dict[tuple[str, str, int], list[tuple[Cell, dict[str, Any], str]]] = {}
    for cell in grid:
        spec = cell.spec(settings)
        digest = fingerprint(spec)
        stored = _done(output_dir / "cells" / f"{cell.key}.json", digest)
        if stored is not None:
            results[cell.key] = stored
        else:
            runs.setdefault((cell.defence, cell.leak_point, cell.seed), []).append((cell, spec, digest))
    todo = sum(len(group) for group in runs.values())
    print_(
        f"bench: {len(grid)} cells, {len(grid) - todo} already done, {todo} to run in {len(runs)} federated "
        f"run(s) with {jobs} job(s)"
    )
    started = time.perf_counter()
    if report_only:
        print_(f"bench: --report_only: the report holds the {len(grid) - todo} finished cells, {todo} are missing")
        command += f" (then --report_only with {len(grid) - todo} of {len(grid)} cells finished)" if todo else ""
        runs = {}

    def finish(group: list[tuple[Cell, dict[str, Any], str]], outcome: dict[str, dict[str, Any]]) -> None:
        for cell, _, digest in group:
            result = outcome[cell.attack]
            entry = {**vars(cell), **result, "fingerprint": digest}
            if result["status"].startswith("ok"):
                write_atomically(output_dir / "cells" / f"{cell.key}.json", entry)
            results[cell.key] = entry
            print_(f"  {cell.key}: {result['status']} (acc {result.get('test_accuracy')}, psnr {result.get('psnr')})")

    work = [
        (group, {cell.attack: spec for cell, spec, _ in group}, str(output_dir / "runs" / f"{d}__{lp}__s{seed}"))
        for (d, lp, seed), group in sorted(runs.items(), key=lambda run: run[0][2])
    ]  # seed by seed: a stopped bench has every defence of the first seeds, and resumes with the rest
    if jobs > 1 and len(work) > 1:
        pool = ProcessPoolExecutor(max_workers=jobs, initializer=_worker_signals)
        try:
            futures = {pool.submit(_run_group, specs, run_dir): group for group, specs, run_dir in work}
            for future in as_completed(futures):
                finish(futures[future], future.result())
        except BaseException:  # Ctrl+C or SIGTERM: drop the queued runs and stop the running ones; finished cells stay
            pool.shutdown(wait=False, cancel_futures=True)
            for worker in multiprocessing.active_children():  # the pool's workers: this process starts no others
                worker.kill()  # not SIGTERM: a Trainer in the worker catches that to stop at its next batch
            raise
        pool.shutdown()
    else:
        for group, specs, run_dir in work:
            finish(group, _run_group(specs, run_dir))
    ordered = [results[c.key] for c in grid if c.key in results]
    rows = report.summarise(ordered)
    output_dir.mkdir(parents=True, exist_ok=True)
    pictures = [
        report.write_scatter(rows, output_dir / "scatter.png"),
        report.write_heatmap(rows, output_dir / "heatmap.png"),
    ]
    report.write_csv(rows, output_dir / "bench.csv")
    report.write_markdown(rows, output_dir / "bench.md", command=command)
    if wandb_project is not None:
        report.log_to_wandb(rows, pictures, project=wandb_project, output_dir=output_dir)
    print_(
        f"bench: wall {time.perf_counter() - started:.0f} s (the grid and the report); CPU {_cpu_seconds():.0f} s "
        f"(user + system of the whole command and its workers); load average {os.getloadavg()[0]:.1f}; "
        f"table {output_dir / 'bench.md'}"
    )
    return rows
