"""The argument parsers of ``lightning-fl``: one per subcommand, built from the signatures they configure.

Configs follow jsonargparse / LightningCLI conventions: every key of a YAML config can also be given on the
command line (``--loop.num_rounds 5``), classes are chosen with ``class_path``/``init_args``, and
``--print_config`` prints the resolved config. The model's ``num_classes``, ``in_channels``, ``image_size``,
``input_mean`` and ``input_std`` are linked from the data when the model's ``__init__`` takes them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ArgumentParser

from lightning_fl.bench.command import bench_parser
from lightning_fl.cli_fit import add_common_arguments, add_overwrite_argument, command_parser, fit_parser
from lightning_fl.cli_help import DESCRIPTION, SUBCOMMAND_HELP
from lightning_fl.datamodules.federated import FederatedDataModule
from lightning_fl.federation.export import GLOBAL_MODEL_FILE

__all__ = [
    "DESCRIPTION",
    "RECORDED_LINKS",
    "SUBCOMMANDS",
    "build_parser",
    "data_links",
    "record_data_links",
]

RECORDED_LINKS = ("num_classes", "in_channels", "image_size")
"""The linked model options a run records in its ``config.yaml`` (the data statistics are recomputed from the data)."""


def data_links(model_args: Any, data: FederatedDataModule) -> dict[str, tuple[Any, Any]]:
    """``{key: (config value, value from the data)}`` for each of :data:`RECORDED_LINKS` the model takes.

    The data sets these options (``num_classes`` of the data set, ``in_channels`` and ``image_size`` of its
    images), whatever the config says; a value that differs was overridden, and the run says so.

    Example:
        >>> from types import SimpleNamespace
        >>> data_links({"num_classes": 5, "lr": 0.1}, SimpleNamespace(model_options={"num_classes": 10}))
        {'num_classes': (5, 10)}
    """
    given = dict(vars(model_args) if hasattr(model_args, "__dict__") else model_args or {})
    return {key: (given[key], data.model_options[key]) for key in RECORDED_LINKS if key in given}


def record_data_links(config: Path, effective: dict[str, Any]) -> None:
    """Write the effective linked values into the saved ``config`` under ``model.init_args``, so that the file
    says what the run used (jsonargparse leaves link targets out when it saves a config)."""
    saved = yaml.safe_load(config.read_text())
    saved.setdefault("model", {}).setdefault("init_args", {}).update(effective)
    config.write_text(yaml.safe_dump(saved, sort_keys=False))


def _attack_parser() -> ArgumentParser:
    from lightning_fl.attacks.base import GradientAttack
    from lightning_fl.attacks.standalone import AttackRun

    parser = command_parser(SUBCOMMAND_HELP["attack"])
    add_common_arguments(parser)
    add_overwrite_argument(parser)
    parser.add_subclass_arguments(GradientAttack, "attack", required=True)
    parser.add_class_arguments(AttackRun, "run")
    parser.add_argument(
        "--ckpt_path",
        type=str | None,
        default=None,
        help=f"the {GLOBAL_MODEL_FILE} a fit run wrote: attack its trained global model (with the same model:, "
        "defences: and data.image_size); default: the model at its initialisation (round 0).",
    )
    return parser


def _evaluate_parser(stage: str) -> Callable[[], ArgumentParser]:
    def build() -> ArgumentParser:
        parser = fit_parser()
        parser.description = SUBCOMMAND_HELP[stage]
        parser.add_argument(
            "--ckpt_path", type=str | None, default=None, help=f"Default: <output_dir>/{GLOBAL_MODEL_FILE}."
        )
        return parser

    return build


SUBCOMMANDS: dict[str, Callable[[], ArgumentParser]] = {
    "fit": fit_parser,
    "attack": _attack_parser,
    "bench": bench_parser,
    "validate": _evaluate_parser("validate"),
    "test": _evaluate_parser("test"),
}


def build_parser() -> ArgumentParser:
    """The ``lightning-fl`` parser with one subcommand per entry of :data:`SUBCOMMANDS`."""
    parser = command_parser(DESCRIPTION, prog="lightning-fl", exit_on_error=False)
    subcommands = parser.add_subcommands(required=True, dest="subcommand")
    for name, build in SUBCOMMANDS.items():
        sub = build()
        subcommands.add_subcommand(name, sub, help=SUBCOMMAND_HELP[name])
    return parser
