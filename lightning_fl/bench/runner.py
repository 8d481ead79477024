"""``lightning-fl bench``: run every cell of the grid (in parallel, resumably) and write the report."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from lightning_fl.bench import report
from lightning_fl.bench.cell import run_cell, write_atomically
from lightning_fl.bench.grid import Cell, cells, fingerprint

__all__ = ["run_bench"]


def _run_one(spec: dict[str, Any], output_dir: str) -> dict[str, Any]:
    """One cell in a worker: its result, or its failure as a status (one failing cell never stops the grid)."""
    import os

    os.environ.setdefault("WANDB_MODE", "offline")
    try:
        return run_cell(spec, Path(output_dir))
    except Exception as err:
        return {"status": f"failed: {type(err).__name__}: {' '.join(str(err).split())[:200]}"}


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
    print_: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Run the grid of ``settings`` and write ``bench.csv``, ``bench.md``, ``scatter.png`` and ``heatmap.png``.

    Each finished cell is stored in ``output_dir/cells/<cell>.json`` (written atomically, with a fingerprint of
    its settings); a cell whose file exists with the same fingerprint is not re-run, so an interrupted bench
    continues where it stopped. ``jobs > 1`` runs cells in that many worker processes.

    Returns:
        the summary rows (one per defence × attack × leak point).
    """
    output_dir = Path(output_dir)
    grid: list[Cell] = cells(settings)
    results: dict[str, dict[str, Any]] = {}
    todo: list[tuple[Cell, dict[str, Any], str]] = []
    for cell in grid:
        spec = cell.spec(settings)
        digest = fingerprint(spec)
        stored = _done(output_dir / "cells" / f"{cell.key}.json", digest)
        if stored is not None:
            results[cell.key] = stored
        else:
            todo.append((cell, spec, digest))
    print_(f"bench: {len(grid)} cells, {len(grid) - len(todo)} already done, {len(todo)} to run with {jobs} job(s)")
    started = time.perf_counter()

    def finish(cell: Cell, digest: str, result: dict[str, Any]) -> None:
        entry = {**vars(cell), **result, "fingerprint": digest}
        if result["status"].startswith("ok"):
            write_atomically(output_dir / "cells" / f"{cell.key}.json", entry)
        results[cell.key] = entry
        print_(f"  {cell.key}: {result['status']} (acc {result.get('test_accuracy')}, psnr {result.get('psnr')})")

    if jobs > 1 and len(todo) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {
                pool.submit(_run_one, spec, str(output_dir / "runs" / cell.key)): (cell, digest)
                for cell, spec, digest in todo
            }
            for future in as_completed(futures):
                finish(*futures[future], future.result())
    else:
        for cell, spec, digest in todo:
            finish(cell, digest, _run_one(spec, str(output_dir / "runs" / cell.key)))
    ordered = [results[c.key] for c in grid]
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
    print_(f"bench: wall {time.perf_counter() - started:.0f} s; table {output_dir / 'bench.md'}")
    return rows
