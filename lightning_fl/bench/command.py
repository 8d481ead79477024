"""The ``lightning-fl bench`` subcommand: its arguments, the grid selection flags and the checks before any run.

Every run of the grid (each defence's utility run, each defence × threat model attack run with all its attacks) is
built once before anything trains or is written, so a broken grid (a bad ``class_path``, a loop key typo, an
unknown leak point, an attack round the run does not have, an ``eval_metric`` the model does not log) exits with 2
and one line naming the run and the key.
"""

from __future__ import annotations

import re
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jsonargparse import ActionYesNo, ArgumentParser, Namespace

from lightning_fl.bench.grid import SELECTABLE, applies, fingerprint, load_settings, model_layers, select, utilities

if TYPE_CHECKING:
    from lightning_fl.federation.loop import FederatedLoop

__all__ = ["RESUME_HINT", "bench_parser", "check_grid", "prepare_bench"]

RESUME_HINT = "a bench continues from its finished runs when the same command runs again"
"""What an interrupted bench prints: its finished runs are kept (``cells/``, ``utility/``), the rest re-run."""


def bench_parser() -> ArgumentParser:
    """The arguments of ``lightning-fl bench``."""
    parser = ArgumentParser(
        description="Every attack against every defence on the same loop: utility runs and short attack runs.",
        allow_abbrev=False,
    )
    parser.add_argument("-c", "--config", type=str, required=True, help="A bench config: configs/bench_digits.yaml.")
    parser.add_argument("--quick", action=ActionYesNo, default=False, help="Merge the config's quick: preset.")
    parser.add_argument("--jobs", type=int, default=1, help="Runs go to this many worker processes.")
    parser.add_argument("--output_dir", type=str | None, default=None, help="Default: the config's output_dir.")
    parser.add_argument("--wandb_project", type=str | None, default=None, help="Also log the table to W&B.")
    parser.add_argument(
        "--report_only", action=ActionYesNo, default=False, help="Write the report from the finished runs; run none."
    )
    parser.add_argument(
        "--data.root", type=str | None, default=None, help="Where torchvision data sets are (overrides data.root)."
    )
    for axis in SELECTABLE:
        parser.add_argument(
            f"--{axis}", type=str | None, default=None, help=f"Comma-separated {axis} of the config to run (all)."
        )
    return parser


def _selected(settings: dict[str, Any], cfg: Namespace) -> tuple[dict[str, Any], str]:
    """``settings`` trimmed by the selection flags, and those flags as they go into the command line."""
    flags = ""
    for axis in SELECTABLE:
        value = cfg.get(axis)
        if value is None:
            continue
        keep: list[Any] = [v.strip() for v in str(value).split(",") if v.strip()]
        if axis == "seeds":
            try:
                keep = [int(v) for v in keep]
            except ValueError:
                raise ValueError(f"--seeds {value}: give comma-separated integers, e.g. --seeds 0,1.") from None
        settings = select(settings, axis, keep)
        flags += f" --{axis} {value}"
    return settings, flags


_MODEL_OPTION = re.compile(r"^model\.init_args\.(\w+) is not an option of ")


def _check_run(where: str, build: Callable[[], Any], layers: Sequence[tuple[str, Mapping[str, Any]]]) -> Any:
    """``build()``, or a one-line error naming the run and, for a model option the model does not take, the config
    keys that set it (:func:`~lightning_fl.bench.grid.model_layers`): a preset's ``optimizer`` under a user's own
    model comes from the preset, not from the user's ``model``."""
    try:
        return build()
    except Exception as err:
        text = err.args[0] if isinstance(err, KeyError) and err.args else err  # str(KeyError) adds quotes
        message = " ".join(str(text).split()).rstrip(".")
        fix = "fix it in the config"
        if option := _MODEL_OPTION.match(message):
            keys = [key for key, layer in layers if option.group(1) in (layer.get("init_args") or {})]
            fix = f"set by {', '.join(keys)}; give that model its own class_path there to replace it" if keys else fix
        raise ValueError(f"bench {where}: {type(err).__name__}: {message}; {fix}.") from None


def _checked_utility_loop(loop: FederatedLoop, checked: set[str], spec: Mapping[str, Any]) -> FederatedLoop:
    """``loop`` once its model logs ``loop.eval_metric`` on one test batch (a run checks it only when it starts);
    once per model and metric, whose keys ``checked`` holds (the defences' layers do not change ``test_step``)."""
    key = fingerprint({"model": spec["model"], "eval_metric": spec["loop"].get("eval_metric")})
    if key not in checked:
        loop.evaluator.check_metric(loop.global_model, loop.datamodule)
        checked.add(key)
    return loop


def check_grid(settings: Mapping[str, Any]) -> None:
    """Build every run of the grid (data, model, defences, attacks, loop) without training it.

    Seeds do not change what a run is made of, so each defence's utility run and each defence × threat model
    attack run is built once, with the first seed.

    Raises:
        ValueError: one line naming the run (defence, threat model) and the error of the part that rejected it.
    """
    from lightning_fl.bench.cell import attack_loop
    from lightning_fl.bench.experiment import build_loop
    from lightning_fl.bench.grid import Cell

    seed = int(settings["seeds"][0])
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the runs' own warnings go to their warnings.txt when they run
        unwritten = Path(tmp) / "never-written"
        metrics_checked: set[str] = set()
        for run in utilities({**settings, "seeds": [seed]}):
            spec = run.spec(settings)
            _check_run(
                f"utility run of defences.{run.defence}",
                lambda spec=spec: _checked_utility_loop(build_loop(spec, unwritten), metrics_checked, spec),
                model_layers(settings, run.defence),
            )
        for defence in settings["defences"]:
            for threat_model, threat in settings["threat_models"].items():
                attacks = [a for a in settings["attacks"] if applies(settings, a, defence, threat_model)]
                runs: dict[str, dict[str, Any]] = {}  # attack run -> its cells' specs (an attack may have its own)
                for a in attacks:
                    spec = Cell(defence, a, threat_model, seed).spec(settings)
                    runs.setdefault(spec["run"], {})[a] = spec
                for specs in runs.values():
                    first = next(iter(specs))
                    where = f"attack run of defences.{defence} under threat_models.{threat_model}"
                    where += f" (attacks.{first})" if len(runs) > 1 else ""
                    layers = model_layers(settings, defence, threat_model, first)
                    loop, _ = _check_run(where, lambda specs=specs: attack_loop(specs, unwritten), layers)
                    _check_rounds(threat_model, threat, next(iter(specs.values()))["attack_rounds"], loop.num_rounds)


def _check_rounds(threat_model: str, threat: Mapping[str, Any], rounds: list[int], num_rounds: int) -> None:
    beyond = sorted(r for r in rounds if not 0 <= r < num_rounds)
    if beyond:
        key = f"threat_models.{threat_model}.attack_rounds" if "attack_rounds" in threat else "attack_rounds"
        raise ValueError(
            f"{key} has {beyond}, which the attack run never reaches: its loop.num_rounds="
            f"{num_rounds} gives rounds 0..{num_rounds - 1}."
        )


def prepare_bench(parser: ArgumentParser, cfg: Namespace) -> Callable[[], list[dict[str, Any]]]:
    """Read, trim and check a bench config; the returned call runs the grid and is the first to write.

    The call's ``resume_hint`` is what the command prints when the bench is interrupted.
    """
    from lightning_fl.bench.runner import check_report_only, run_bench
    from lightning_fl.federation.run_lock import RunLock
    from lightning_fl.validation import check_output_dir

    if cfg.jobs < 1:
        raise ValueError(f"--jobs={cfg.jobs} must be >= 1.")
    chosen = [axis for axis in SELECTABLE if cfg.get(axis) is not None]
    settings, flags = _selected(load_settings(cfg.config, quick=cfg.quick, chosen_elsewhere=chosen), cfg)
    if cfg.data.root is not None:
        settings = {**settings, "data": {**settings["data"], "root": cfg.data.root}}
        flags += f" --data.root {cfg.data.root}"
    output_dir = Path(cfg.output_dir or settings.get("output_dir", "runs/bench"))
    check_output_dir(output_dir)
    lock = RunLock(output_dir)
    lock.check()  # a bench running there: exit 2 now, not after building the grid
    if cfg.report_only:
        check_report_only(settings, output_dir)  # before the lock writes: a report of nothing writes nothing
    else:
        check_grid(settings)
    lock.acquire()  # the last check and the first write, as fit's: a bench started alongside exits 2 too
    flags += f" --output_dir {cfg.output_dir}" if cfg.output_dir else ""
    command = f"lightning-fl bench -c {cfg.config}" + (" --quick" if cfg.quick else "") + flags + f" --jobs {cfg.jobs}"

    def bench() -> list[dict[str, Any]]:
        rows = run_bench(
            settings,
            output_dir,
            jobs=cfg.jobs,
            command=command,
            wandb_project=cfg.wandb_project,
            report_only=cfg.report_only,
            title=f"{Path(cfg.config).stem}, {'quick' if cfg.quick else 'full'} budget",
            lock=lock,
        )
        failed = [f"{r['defence']}/{r['attack']}/{r['threat_model']}" for r in rows if "failed" in r["status"]]
        if failed:
            raise RuntimeError(
                f"{len(failed)} bench row(s) failed ({', '.join(failed[:3])}{', ...' if len(failed) > 3 else ''}); "
                f"their status is in {output_dir / 'bench.md'}"
            )
        return rows

    bench.resume_hint = f"{RESUME_HINT}: {command}"  # type: ignore[attr-defined]
    return bench
