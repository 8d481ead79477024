"""The argument parsers of ``lightning-fl``: one per subcommand, built from the signatures they configure.

Configs follow jsonargparse / LightningCLI conventions: every key of a YAML config can also be given on the
command line (``--loop.num_rounds 5``), classes are chosen with ``class_path``/``init_args``, and
``--print_config`` prints the resolved config. The model's ``num_classes``, ``in_channels``, ``image_size``,
``input_mean`` and ``input_std`` are linked from the data when the model's ``__init__`` takes them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, DefaultHelpFormatter

from lightning_fl.bench.command import bench_parser
from lightning_fl.bench.experiment import FIT_COMMAND_LOOP_DEFAULTS
from lightning_fl.cli_help import DESCRIPTION, SUBCOMMAND_HELP
from lightning_fl.datamodules.federated import FederatedDataModule
from lightning_fl.defences.base import Defence
from lightning_fl.federation.export import GLOBAL_MODEL_FILE
from lightning_fl.federation.loop import FederatedLoop
from lightning_fl.transforms import ServerPlugin

__all__ = [
    "DESCRIPTION",
    "RECORDED_LINKS",
    "SUBCOMMANDS",
    "ShortHelpFormatter",
    "build_parser",
    "data_links",
    "record_data_links",
]

_KNOWN = ", known subclasses: "
_LIBRARY_CLASSES = ("torch.", "torchvision.", "lightning.", "pytorch_lightning.", "torchmetrics.")


class ShortHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help, with each type's list of known subclasses cut to the toolkit's and the user's own.

    jsonargparse lists every imported subclass of a type: ``torch.utils.data.Dataset`` brings about 150 DataPipe
    and torchvision classes, printed for ``--data.dataset`` and again for ``--data.test_dataset``. Any class path
    is still accepted; the help says so instead of listing the libraries' classes.
    """

    def _get_help_string(self, action: Any) -> str:
        text = super()._get_help_string(action)
        head, known, tail = text.partition(_KNOWN)
        if not known or not tail.endswith(")"):
            return text
        paths = tail[:-1].split(", ")
        own = [path for path in paths if not path.startswith(_LIBRARY_CLASSES)]
        listed = f"{_KNOWN}{', '.join(own)}" if own else ""
        return f"{head}{listed}{', or any class_path' if len(own) < len(paths) else ''})"


_DATA_LINKS = (
    "num_classes",
    "in_channels",
    "image_size",
    "input_mean",
    "input_std",
)  # FederatedDataModule.model_options


def _common(parser: ArgumentParser) -> None:
    parser.add_argument("-c", "--config", action=ActionConfigFile, help="Path to a YAML config.")
    parser.add_argument("--seed_everything", type=int, default=0, help="Seed of model init, partition and loop.")
    parser.add_argument("--output_dir", type=str, default="runs/lightning-fl", help="Run directory.")
    parser.add_class_arguments(FederatedDataModule, "data")
    parser.add_subclass_arguments(L.LightningModule, "model", required=True)
    parser.add_argument(
        "--defences", type=list[Defence], default=[], help="Defence bundles applied to the model (and the run)."
    )
    parser.add_argument(
        "--server_plugins",
        type=list[ServerPlugin],
        default=[],
        help="What a malicious server changes of the model it ships (applied before the defences).",
    )
    for key in _DATA_LINKS:
        parser.link_arguments(
            "data", f"model.init_args.{key}", compute_fn=partial(_model_option, key=key), apply_on="instantiate"
        )


def _overwrite(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--overwrite",
        type=bool,
        default=False,
        help="Replace the run already in output_dir (the files a run wrote are deleted, other files are kept).",
    )


def _parser(description: str, **kwargs: Any) -> ArgumentParser:
    """A parser that takes keys spelt in full only and prints the short help."""
    return ArgumentParser(description=description, allow_abbrev=False, formatter_class=ShortHelpFormatter, **kwargs)


def _model_option(data: FederatedDataModule, key: str) -> Any:
    return data.model_options[key]


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


def _fit_parser() -> ArgumentParser:
    parser = _parser(SUBCOMMAND_HELP["fit"])
    _common(parser)
    parser.add_argument("--resume", type=bool, default=False, help="Continue from the last completed round.")
    _overwrite(parser)
    parser.add_class_arguments(
        FederatedLoop,
        "loop",
        skip={"model", "datamodule", "defences", "server_plugins", "output_dir", "seed"},
        instantiate=False,
    )
    parser.set_defaults({f"loop.{key}": value for key, value in FIT_COMMAND_LOOP_DEFAULTS.items()})
    return parser


def _attack_parser() -> ArgumentParser:
    from lightning_fl.attacks.base import GradientAttack
    from lightning_fl.attacks.standalone import AttackRun

    parser = _parser(SUBCOMMAND_HELP["attack"])
    _common(parser)
    _overwrite(parser)
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
        parser = _fit_parser()
        parser.description = SUBCOMMAND_HELP[stage]
        parser.add_argument(
            "--ckpt_path", type=str | None, default=None, help=f"Default: <output_dir>/{GLOBAL_MODEL_FILE}."
        )
        return parser

    return build


SUBCOMMANDS: dict[str, Callable[[], ArgumentParser]] = {
    "fit": _fit_parser,
    "attack": _attack_parser,
    "bench": bench_parser,
    "validate": _evaluate_parser("validate"),
    "test": _evaluate_parser("test"),
}


def build_parser() -> ArgumentParser:
    """The ``lightning-fl`` parser with one subcommand per entry of :data:`SUBCOMMANDS`."""
    parser = _parser(DESCRIPTION, prog="lightning-fl", exit_on_error=False)
    subcommands = parser.add_subcommands(required=True, dest="subcommand")
    for name, build in SUBCOMMANDS.items():
        sub = build()
        subcommands.add_subcommand(name, sub, help=SUBCOMMAND_HELP[name])
    return parser
