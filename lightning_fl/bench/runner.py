"""``lightning-fl bench``: run the utility runs and the attack runs of the grid (in parallel, resumably) and report.

Two kinds of work: one utility run per defence and seed (:func:`~lightning_fl.bench.cell.run_utility`), and one
short attack run per defence, threat model and seed, every attack a callback of it
(:func:`~lightning_fl.bench.cell.run_attacks`). An attack run of a ``trained`` threat model starts from its
utility run's final global model, so it is queued when that run has finished. Worker processes are started once
and kept for the whole grid, and each sets its torch thread count to its share of the cores.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import signal
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from functools import partial
from pathlib import Path
from typing import Any

from lightning_fl.bench import report
from lightning_fl.bench.cell import failure, run_attacks, run_utility, write_atomically
from lightning_fl.bench.grid import Cell, Utility, apply_only, cells, expand_strengths, fingerprint, utilities
from lightning_fl.code_fingerprint import code_fingerprint
from lightning_fl.federation.run_lock import RunLock

__all__ = ["available_cores", "check_report_only", "run_bench", "threads_per_job"]

_PRINT = partial(print, flush=True)  # progress lines appear as they happen, also in a log file
_GLOBAL_MODEL = "global_model.safetensors"  # lightning_fl.federation.export.GLOBAL_MODEL_FILE, without importing torch


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_job(jobs: int, cores: int | None = None) -> int:
    """Torch threads for each of ``jobs`` processes sharing ``cores``: an equal share, at least one.

    Two jobs each running torch's default (one thread per core) would fight for the same cores (docs/bench.md).

    Example:
        >>> threads_per_job(2, cores=2), threads_per_job(3, cores=16), threads_per_job(4, cores=2)
        (1, 5, 1)
    """
    return max(1, (available_cores() if cores is None else cores) // jobs)


def _run(kind: str, payload: Any, output_dir: str, trained: str | None = None) -> Any:
    """One run in a worker: its result, or its failure as its status (one failing run never stops the grid)."""
    os.environ.setdefault("WANDB_MODE", "offline")
    try:
        if kind == "utility":
            return run_utility(payload, Path(output_dir))
        return run_attacks(payload, Path(output_dir), trained=trained)
    except Exception as err:
        return {"status": failure(err)} if kind == "utility" else {name: {"status": failure(err)} for name in payload}


def _worker_init(threads: int, bench: int) -> None:
    """In a worker: its share of the cores; it dies with the bench process ``bench`` (a bench killed with SIGKILL
    leaves no worker training on, into its output directory); Ctrl+C is the main process's to handle (it stops the
    workers), and SIGTERM is not turned into the command's exception, which the pool would survive."""
    import torch

    from lightning_fl.federation.distributed import die_with_parent

    die_with_parent(bench)
    torch.set_num_threads(threads)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process since it started and of its finished children (the workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _duration(seconds: float) -> str:
    """``seconds`` as a person reads a run's length: ``"42 s"``, ``"13 min"``, ``"2.4 h"``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _progress_line(done: int, total: int, elapsed: float) -> str:
    """How far a bench is: ``done`` of its ``total`` runs (utility and attack runs) finished after ``elapsed``
    seconds, and the time the rest takes at the mean pace so far (runs differ in cost, so it is a rough guide).

    Example:
        >>> _progress_line(3, 12, 600.0)
        'bench: 3 of 12 runs done, 10 min so far, ~30 min to go at this pace'
        >>> _progress_line(12, 12, 7200.0)
        'bench: 12 of 12 runs done, 2.0 h so far'
    """
    line = f"bench: {done} of {total} runs done, {_duration(elapsed)} so far"
    if done < total:
        line += f", ~{_duration(elapsed / done * (total - done))} to go at this pace"
    return line


def _done(path: Path, digest: str, code: str | None) -> dict[str, Any] | None:
    """The result stored at ``path`` if it was made with the settings of ``digest`` and, unless ``code`` is None, by
    the code of that :func:`~lightning_fl.code_fingerprint.code_fingerprint`."""
    if not path.exists():
        return None
    stored = json.loads(path.read_text())
    if stored.get("fingerprint") != digest or code not in (None, stored.get("code")):
        return None
    return stored


def _stored(
    runs: list[Any], settings: Mapping[str, Any], folder: Path, code: str | None
) -> tuple[dict[str, Any], list[Any]]:
    """The results of ``runs`` finished with their current settings and ``code`` (any code when None), by key, and
    the others with their spec and fingerprint."""
    done: dict[str, Any] = {}
    todo: list[Any] = []
    for run in runs:
        spec = run.spec(settings)
        digest = fingerprint(spec)
        stored = _done(folder / f"{run.key}.json", digest, code)
        if stored is not None:
            done[run.key] = stored
        else:
            todo.append((run, spec, digest))
    return done, todo


def check_report_only(settings: Mapping[str, Any], output_dir: str | Path) -> None:
    """Check that a ``--report_only`` bench has something to report: a cell of this grid (its selection and
    settings, by any code) finished in ``output_dir``. Reads only, so it runs before the run lock writes anything.

    Raises:
        ValueError: when none has, naming the directory and the fix.
    """
    settings = expand_strengths(apply_only(settings))
    done, _ = _stored(cells(settings), settings, Path(output_dir) / "cells", code=None)
    if not done:  # a report of nothing (it crashed drawing zero panels)
        raise ValueError(
            f"--report_only: no cell of this grid has finished in {str(output_dir)!r}; run the bench without "
            "--report_only first (the same selection and output_dir)."
        )


class _Executor:
    """``jobs`` worker processes, or this process when ``jobs`` is 1 (the same calls, run at once)."""

    def __init__(self, jobs: int) -> None:
        self.pool = (
            ProcessPoolExecutor(
                max_workers=jobs, initializer=_worker_init, initargs=(threads_per_job(jobs), os.getpid())
            )
            if jobs > 1
            else None
        )

    def submit(self, *args: Any) -> Future:
        if self.pool is not None:
            return self.pool.submit(_run, *args)
        future: Future = Future()
        future.set_result(_run(*args))
        return future

    def stop(self) -> None:
        """Drop the queued runs and stop the running ones (Ctrl+C or SIGTERM); finished results stay."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            for worker in multiprocessing.active_children():  # the pool's workers: this process starts no others
                worker.kill()  # not SIGTERM: a Trainer in the worker catches that to stop at its next batch

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def run_bench(
    settings: Mapping[str, Any],
    output_dir: str | Path,
    *,
    jobs: int = 1,
    command: str = "lightning-fl bench",
    wandb_project: str | None = None,
    report_only: bool = False,
    title: str | None = None,
    print_: Callable[[str], None] = _PRINT,
    lock: RunLock | None = None,
) -> list[dict[str, Any]]:
    """Run the grid of ``settings`` and write ``bench.csv``, ``bench.md`` and the per-threat-model plots.

    The Python form of ``lightning-fl bench``: ``settings`` is a bench config as a mapping (the keys of
    docs/bench.md, "The config"), e.g. from :func:`~lightning_fl.bench.grid.load_settings` or written in code. Its
    ``data`` section is a ``lightning-fl fit`` config's: ``dataset`` may be a name, an ImageFolder path, or a
    ``LightningDataModule`` (``{class_path: my.DataModule, init_args: {...}}`` or the class path alone). Its
    ``only:`` section trims the grid (:func:`~lightning_fl.bench.grid.apply_only`), as ``--defences``/``--attacks``/
    ``--threat_models``/``--seeds`` do on the command line; unlike the command, nothing is built before the first
    run, so a broken run fails its rows (``status``) instead of raising.

    Each finished run is stored in ``output_dir/utility/<run>.json`` or ``output_dir/cells/<cell>.json`` (written
    atomically, with a fingerprint of its settings and that of the code that made it); one whose file exists
    with the same fingerprint and code is not re-run, so an interrupted bench continues where it stopped when the
    same command runs again, and a changed attack or defence is measured anew. ``jobs > 1`` runs the utility and
    attack runs in that many worker processes.

    With ``report_only`` nothing runs: the report is written from the runs finished so far, whichever code made them
    (a stopped bench's partial table, redrawn), and the number of cells it lacks or that other code made is printed.
    ``title`` heads the plots and the table (preset and budget); the seeds are added to it.

    Returns:
        the summary rows (one per defence × attack × threat model); a row's ``status`` starts with ``failed`` when
        a run of it failed.

    ``lock``: ``output_dir``'s run lock when the caller took it already (the command takes it before it returns
    from its checks); released when the bench ends either way.

    Raises:
        ValueError: ``report_only`` before any cell of the grid finished (:func:`check_report_only`).
        RuntimeError: another bench (or run) holds ``output_dir``'s run lock
            (:class:`~lightning_fl.federation.RunLock`, held while the bench runs), naming its pid.

    Example::

        settings = load_settings("configs/bench_digits.yaml", quick=True)
        settings["only"] = {"defences": ["none"], "attacks": ["ig"], "threat_models": ["fedsgd_b1"], "seeds": [0]}
        rows = run_bench(settings, "runs/bench_ig")  # one cell: rows[0]["psnr"], rows[0]["test_accuracy"]
    """
    if report_only:
        check_report_only(settings, output_dir)
    lock = lock or RunLock(output_dir)  # one bench writes a table: a second one into the directory stops here
    try:
        lock.acquire()
        return _run_grid(
            settings,
            Path(output_dir),
            jobs=jobs,
            command=command,
            wandb_project=wandb_project,
            report_only=report_only,
            title=title,
            print_=print_,
        )
    finally:
        lock.release()


def _run_grid(
    settings: Mapping[str, Any],
    output_dir: Path,
    *,
    jobs: int,
    command: str,
    wandb_project: str | None,
    report_only: bool,
    title: str | None,
    print_: Callable[[str], None],
) -> list[dict[str, Any]]:
    """:func:`run_bench`'s work, with the output directory's run lock held."""
    settings = expand_strengths(apply_only(settings))
    code = code_fingerprint()
    reusable = None if report_only else code  # a report draws what is stored, whichever code made it
    utility, todo_utility = _stored(utilities(settings), settings, output_dir / "utility", reusable)
    grid: list[Cell] = cells(settings)
    results, todo_cells = _stored(grid, settings, output_dir / "cells", reusable)
    groups: dict[str, list[tuple[Cell, dict[str, Any], str]]] = {}  # attack run -> its cells
    for cell, spec, digest in todo_cells:
        groups.setdefault(spec["run"], []).append((cell, spec, digest))
    todo = sum(len(group) for group in groups.values())
    print_(
        f"bench: {len(todo_utility)} of {len(utility) + len(todo_utility)} utility run(s) and {todo} of {len(grid)} "
        f"attack cells to run ({len(grid) - todo} already done) in {len(groups)} attack run(s), with {jobs} job(s)"
    )
    started = time.perf_counter()
    if report_only:
        other = sum(result.get("code") != code for result in results.values())
        print_(
            f"bench: --report_only: the report holds the {len(grid) - todo} finished cells ({other} made by other "
            f"lightning-fl code than this one's, which a run without --report_only re-runs), {todo} are missing"
        )
        command += f" (then --report_only with {len(grid) - todo} of {len(grid)} cells finished)" if todo else ""
        todo_utility, groups = [], {}

    def finish_utility(run: Utility, digest: str, result: dict[str, Any]) -> None:
        entry = {**vars(run), **result, "fingerprint": digest, "code": code}
        if result["status"] == "ok":
            write_atomically(output_dir / "utility" / f"{run.key}.json", entry)
        utility[run.key] = entry
        print_(
            f"  utility {run.key}: {result['status']} (acc {result.get('test_accuracy')}, ε {result.get('epsilon')})"
        )

    def finish_cells(group: list[tuple[Cell, dict[str, Any], str]], outcome: dict[str, dict[str, Any]]) -> None:
        for cell, spec, digest in group:
            result = outcome[cell.attack]
            entry = {**vars(cell), "leak_point": spec["leak_point"], "server": spec["server"], **result}
            entry |= {"fingerprint": digest, "code": code}
            if result["status"].startswith("ok"):
                write_atomically(output_dir / "cells" / f"{cell.key}.json", entry)
            results[cell.key] = entry
            print_(f"  {cell.key}: {result['status']} (psnr {result.get('psnr')})")

    def submit_group(executor: _Executor, key: str) -> Future:
        group = groups[key]
        cell = group[0][0]
        trained = None
        if group[0][1]["trained_from"] is not None:
            trained = str(output_dir / "runs" / "utility" / cell.utility.key / _GLOBAL_MODEL)
        specs = {c.attack: spec for c, spec, _ in group}
        return executor.submit("attack", specs, str(output_dir / "runs" / key), trained)

    executor = _Executor(jobs)
    pending: dict[Future, Any] = {}

    def add(future: Future, job: Any) -> None:
        """Record a run's result as soon as it is known: with one job it ran already, so it is recorded now (a
        stopped bench keeps it); with workers, when it finishes."""
        if executor.pool is None:
            collect(future, job)
        else:
            pending[future] = job

    runs, finished_runs = len(todo_utility) + len(groups), 0

    def count_finished() -> None:
        nonlocal finished_runs
        finished_runs += 1
        print_(_progress_line(finished_runs, runs, time.perf_counter() - started))

    def collect(future: Future, job: Any) -> None:
        if isinstance(job[0], Utility):
            run, digest = job
            finish_utility(run, digest, future.result())
            for key in waiting.pop(run.key, []):
                if utility[run.key]["status"] == "ok":
                    add(submit_group(executor, key), key)
                else:
                    names = {c.attack: {"status": "failed: its utility run failed"} for c, _, _ in groups[key]}
                    finish_cells(groups[key], names)
                    count_finished()
        else:
            finish_cells(groups[job], future.result())
        count_finished()

    waiting: dict[str, list[str]] = {}  # utility run key -> trained-model attack runs after it
    try:
        for key, group in groups.items():
            cell = group[0][0]
            if group[0][1]["trained_from"] is not None and cell.utility.key not in utility:
                waiting.setdefault(cell.utility.key, []).append(key)
        after_utility = {key for keys in waiting.values() for key in keys}  # submitted when their model exists
        for run, spec, digest in todo_utility:  # with one job each runs now, and its waiting attack runs with it
            add(executor.submit("utility", spec, str(output_dir / "runs" / "utility" / run.key)), (run, digest))
        for key, _ in sorted(groups.items(), key=lambda item: item[1][0][0].seed):
            if key not in after_utility:
                add(submit_group(executor, key), key)
        while pending:
            finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for future in finished:
                collect(future, pending.pop(future))
    except BaseException:
        executor.stop()
        raise
    executor.close()
    rows = report.summarise(
        [results[c.key] for c in grid if c.key in results], utility, settings["defences"], settings["attacks"]
    )
    report.reconstruction_bounds(rows, kappa=settings.get("rero_kappa"))
    output_dir.mkdir(parents=True, exist_ok=True)
    bound = float(settings.get("epsilon_bound", 10.0))
    seeds = f"seed{'s' if len(settings['seeds']) > 1 else ''} {', '.join(map(str, settings['seeds']))}"
    title = f"{title}, {seeds}" if title else seeds
    pictures = [
        report.write_scatter(rows, output_dir / "privacy_utility.png", epsilon_bound=bound, title=title),
        report.write_heatmap(rows, output_dir / "heatmap.png", title=title),
    ]
    extra = [
        report.write_bounds(rows, output_dir / "reconstruction_bound.png", title=title),
        report.write_leakage_by_round(rows, output_dir / "leakage_by_round.png", title=title),
    ]
    pictures += [picture for picture in extra if picture is not None]
    report.write_csv(rows, output_dir / "bench.csv")
    report.write_markdown(rows, output_dir / "bench.md", command=command, epsilon_bound=bound, title=title)
    if wandb_project is not None:
        config = {**settings, "jobs": jobs, "command": command}
        report.log_to_wandb(rows, pictures, project=wandb_project, output_dir=output_dir, config=config)
    print_(
        f"bench: wall {time.perf_counter() - started:.0f} s (the grid and the report); CPU {_cpu_seconds():.0f} s "
        f"(user + system of the whole command and its workers); load average {os.getloadavg()[0]:.1f}; "
        f"table {output_dir / 'bench.md'}"
    )
    return rows
