"""The ``lightning-fl`` command: ``fit`` (federated training) and ``attack`` (one attack on one batch).

Configs follow jsonargparse / LightningCLI conventions: every key of a YAML config can also be given on the
command line (``--loop.num_rounds 5``), classes are chosen with ``class_path``/``init_args``, and
``--print_config`` prints the resolved config. The model's ``num_classes``, ``in_channels``, ``image_size``,
``input_mean`` and ``input_std`` are linked from the data when the model's ``__init__`` takes them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from lightning_fl.datamodules.federated import FederatedDataModule
from lightning_fl.loop import FederatedLoop

__all__ = ["build_parser", "main"]

_DATA_LINKS = (
    "num_classes",
    "in_channels",
    "image_size",
    "input_mean",
    "input_std",
)  # FederatedDataModule.model_options


def _common(parser: ArgumentParser) -> None:
    parser.add_argument("--config", action=ActionConfigFile, help="Path to a YAML config.")
    parser.add_argument("--seed_everything", type=int, default=0, help="Seed of model init, partition and loop.")
    parser.add_argument("--output_dir", type=str, default="runs/lightning-fl", help="Run directory.")
    parser.add_class_arguments(FederatedDataModule, "data")
    parser.add_subclass_arguments(L.LightningModule, "model", required=True)
    for key in _DATA_LINKS:
        parser.link_arguments(
            "data", f"model.init_args.{key}", compute_fn=partial(_model_option, key=key), apply_on="instantiate"
        )


def _model_option(data: FederatedDataModule, key: str) -> Any:
    return data.model_options[key]


def _fit_parser() -> ArgumentParser:
    parser = ArgumentParser(description="Federated training with per-client Lightning Trainers.")
    _common(parser)
    parser.add_argument("--resume", type=bool, default=False, help="Continue from the last completed round.")
    parser.add_class_arguments(
        FederatedLoop, "loop", skip={"model", "datamodule", "output_dir", "seed"}, instantiate=False
    )
    return parser


def _attack_parser() -> ArgumentParser:
    from lightning_fl.attacks.base import GradientAttack
    from lightning_fl.attacks.standalone import run_attack

    parser = ArgumentParser(description="One gradient-leakage attack on one batch of a client's data (no rounds).")
    _common(parser)
    parser.add_subclass_arguments(GradientAttack, "attack", required=True)
    parser.add_function_arguments(run_attack, "run", skip={"attack", "data", "model", "output_dir", "seed"})
    return parser


SUBCOMMANDS: dict[str, Callable[[], ArgumentParser]] = {"fit": _fit_parser, "attack": _attack_parser}


def build_parser() -> ArgumentParser:
    """The ``lightning-fl`` parser with one subcommand per entry of :data:`SUBCOMMANDS`."""
    parser = ArgumentParser(prog="lightning-fl", description=__doc__.splitlines()[0], exit_on_error=False)
    subcommands = parser.add_subcommands(required=True, dest="subcommand")
    for name, build in SUBCOMMANDS.items():
        sub = build()
        subcommands.add_subcommand(name, sub, help=sub.description)
    return parser


def _instantiate(parser: ArgumentParser, cfg: Namespace) -> Namespace:
    """Build data first (so links can read it), then everything else, seeded."""
    L.seed_everything(cfg.seed_everything, verbose=False)
    cfg.data.seed = cfg.data.seed if cfg.data.seed else cfg.seed_everything
    return parser.instantiate_classes(cfg)


def _run_fit(parser: ArgumentParser, cfg: Namespace) -> dict[str, Any]:
    init = _instantiate(parser, cfg)
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    parser.save(cfg, output_dir / "config.yaml", overwrite=True, skip_check=True)
    loop = FederatedLoop(init.model, init.data, output_dir=output_dir, seed=cfg.seed_everything, **vars(init.loop))
    summary = loop.fit(resume=cfg.resume)
    print(f"rounds completed: {summary['rounds_completed']}, test accuracy: {summary['test_accuracy']}")
    print(f"summary: {output_dir / 'summary.json'}")
    return summary


def _run_attack(parser: ArgumentParser, cfg: Namespace) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    from lightning_fl.attacks.standalone import run_attack

    init = _instantiate(parser, cfg)
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    parser.save(cfg, output_dir / "config.yaml", overwrite=True, skip_check=True)
    entry = run_attack(
        init.attack, data=init.data, model=init.model, output_dir=output_dir, seed=cfg.seed_everything, **vars(init.run)
    )
    table = Table("metric", "value", title=f"{entry['attack']} on {entry['num_images']} image(s)")
    for key in ("mse", "psnr", "ssim", "lpips", "label_accuracy", "psnr_ref_rmse", "seconds"):
        table.add_row(key, "null" if entry[key] is None else f"{entry[key]:.4g}")
    Console().print(table)
    print(f"attacked: {', '.join(map(str, entry['attacked']))}")
    print(f"comparison grid: {entry['image']}")
    print(f"summary: {output_dir / 'summary.json'}")
    return entry


RUNNERS: dict[str, Callable[[ArgumentParser, Namespace], Any]] = {"fit": _run_fit, "attack": _run_attack}


def _quiet() -> None:
    os.environ.setdefault("WANDB_MODE", "offline")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")


def _one_line(err: BaseException) -> str:
    """The most specific message of ``err`` on one line (jsonargparse wraps ours in its own)."""
    while err.__cause__ is not None:
        err = err.__cause__
    message = " ".join(str(err).split())
    if "Errors: - " in message:  # a union of types: keep the first alternative's reason
        message = message.split("Errors: - ", 1)[1].split(" - Expected", 1)[0]
    return message.split(" failed: ", 1)[-1]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lightning-fl``; returns the exit code (2 for a bad config, before any training)."""
    _quiet()
    parser = build_parser()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = parser.parse_args(args)
        RUNNERS[cfg.subcommand](SUBCOMMANDS[cfg.subcommand](), cfg[cfg.subcommand])
    except (argparse.ArgumentError, ValueError, TypeError, KeyError, RuntimeError, FileNotFoundError) as err:
        print(f"lightning-fl: error: {_one_line(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
