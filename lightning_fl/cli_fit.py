"""The ``lightning-fl fit`` config and the one builder of a federated run from it.

A fit config (``seed_everything``, ``data:``, ``model:``, ``defences:``, ``server_plugins:``, ``loop:``) is read by
the fit command's own parser (:func:`fit_parser`, jsonargparse, from the classes' signatures), which builds every
``class_path``/``init_args`` entry and links the data's ``num_classes``, ``in_channels``, ``image_size``,
``input_mean`` and ``input_std`` into the model when its ``__init__`` takes them. :func:`assemble_loop` makes the
:class:`~lightning_fl.federation.FederatedLoop` of the built parts. The command (:mod:`lightning_fl.cli_run`), the
bench and the benchmark scripts (:func:`lightning_fl.bench.build_loop` through :func:`build_fit_loop`) build every
run here, so one config trains alike from each: the same defaults, links and class paths.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L
from jsonargparse import ActionConfigFile, ArgumentError, ArgumentParser, DefaultHelpFormatter, Namespace

from lightning_fl.cli_help import SUBCOMMAND_HELP
from lightning_fl.datamodules.federated import FederatedDataModule, check_name_only_keys
from lightning_fl.defences.base import Defence
from lightning_fl.federation.loop import FederatedLoop
from lightning_fl.transforms import ServerPlugin
from lightning_fl.validation import check_seed

if TYPE_CHECKING:
    from lightning_fl.callbacks.base import FederatedCallback

__all__ = [
    "DATA_LINKS",
    "FIT_COMMAND_LOOP_DEFAULTS",
    "ShortHelpFormatter",
    "add_common_arguments",
    "add_overwrite_argument",
    "assemble_loop",
    "build_fit_loop",
    "command_parser",
    "fit_parser",
    "instantiate_config",
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


DATA_LINKS = ("num_classes", "in_channels", "image_size", "input_mean", "input_std")
"""The options of :attr:`FederatedDataModule.model_options` linked into ``model.init_args`` (when the model takes
them): the data sets them, whatever the config says."""

FIT_COMMAND_LOOP_DEFAULTS: dict[str, Any] = {"vectorize": "auto"}
"""Where ``lightning-fl fit``'s ``loop:`` defaults differ from :class:`FederatedLoop`'s: the command stacks plain
clients where it pays (docs/performance.md, "Vectorised clients"). :func:`fit_parser` sets them as its defaults, so
every run built from a fit config (the command's, the bench's, a benchmark script's) trains with them."""


def command_parser(description: str, **kwargs: Any) -> ArgumentParser:
    """A parser of one subcommand that takes keys spelt in full only and prints the short help."""
    return ArgumentParser(description=description, allow_abbrev=False, formatter_class=ShortHelpFormatter, **kwargs)


def _model_option(data: FederatedDataModule, key: str) -> Any:
    return data.model_options[key]


def add_common_arguments(parser: ArgumentParser) -> None:
    """The keys ``fit``, ``attack``, ``validate`` and ``test`` share: config file, seed, output directory, data,
    model (its data options linked from the data), defences and server plug-ins."""
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
    for key in DATA_LINKS:
        parser.link_arguments(
            "data", f"model.init_args.{key}", compute_fn=partial(_model_option, key=key), apply_on="instantiate"
        )


def add_overwrite_argument(parser: ArgumentParser) -> None:
    """``--overwrite``: replace the run already in ``output_dir``."""
    parser.add_argument(
        "--overwrite",
        type=bool,
        default=False,
        help="Replace the run already in output_dir (the files a run wrote are deleted, other files are kept).",
    )


def fit_parser() -> ArgumentParser:
    """The parser of ``lightning-fl fit``: the common keys, ``resume``, ``overwrite`` and ``loop:``
    (:class:`FederatedLoop`'s settings, with :data:`FIT_COMMAND_LOOP_DEFAULTS`)."""
    parser = command_parser(SUBCOMMAND_HELP["fit"])
    add_common_arguments(parser)
    parser.add_argument("--resume", type=bool, default=False, help="Continue from the last completed round.")
    add_overwrite_argument(parser)
    parser.add_class_arguments(
        FederatedLoop,
        "loop",
        skip={"model", "datamodule", "defences", "server_plugins", "output_dir", "seed"},
        instantiate=False,
    )
    parser.set_defaults({f"loop.{key}": value for key, value in FIT_COMMAND_LOOP_DEFAULTS.items()})
    return parser


@functools.cache
def _build_parser() -> ArgumentParser:
    """The fit parser :func:`build_fit_loop` parses every mapping with, built once per process: parsing and
    instantiating leave a jsonargparse parser as it was, and this one is never handed out (the command adds its
    own keys to a :func:`fit_parser` of its own)."""
    parser = fit_parser()
    parser.exit_on_error = False
    return parser


def instantiate_config(parser: ArgumentParser, cfg: Namespace) -> Namespace:
    """Seed everything (``seed_everything``, also the data's seed unless ``data.seed`` is set), then build every
    ``class_path`` entry of ``cfg``: data first, so that its options can be linked into the model."""
    check_seed(cfg.seed_everything)
    L.seed_everything(cfg.seed_everything, verbose=False)
    cfg.data.seed = cfg.data.seed if cfg.data.seed else cfg.seed_everything
    return parser.instantiate(cfg)


def assemble_loop(
    cfg: Namespace,
    init: Namespace,
    output_dir: str | Path,
    *,
    callbacks: Sequence[FederatedCallback] = (),
    **overrides: Any,
) -> FederatedLoop:
    """The :class:`FederatedLoop` of a fit config ``cfg`` whose parts ``init`` holds (:func:`instantiate_config`).

    Args:
        cfg: the parsed config (its ``seed_everything``).
        init: the built config: ``model``, ``data``, ``defences``, ``server_plugins`` and the ``loop`` settings.
        output_dir: the run directory.
        callbacks: federated callbacks added after the config's own ``loop.callbacks`` (the bench's attacks).
        overrides: ``loop`` settings that replace the config's (the bench's ``checkpoint=False``).
    """
    options = {**vars(init.loop), **overrides}
    options["callbacks"] = [*(options.get("callbacks") or ()), *callbacks]
    return FederatedLoop(
        init.model,
        init.data,
        defences=init.defences,
        server_plugins=init.server_plugins,
        output_dir=output_dir,
        seed=cfg.seed_everything,
        **options,
    )


def build_fit_loop(
    config: Mapping[str, Any],
    output_dir: str | Path,
    *,
    callbacks: Sequence[FederatedCallback] = (),
    **overrides: Any,
) -> FederatedLoop:
    """The federated run of a fit config given as a mapping (a YAML file's content), built as ``lightning-fl fit``
    builds it; nothing is written yet.

    ``config``'s entries may be ``class_path``/``init_args`` mappings or objects already built.

    Raises:
        ValueError: one line naming the key that the parser or the part built from it rejected.
    """
    from lightning_fl.cli_errors import one_line

    parser = _build_parser()
    data = config.get("data") or {}
    if data.get("dataset") is not None:  # without one, the default name
        check_name_only_keys(data["dataset"], data)  # what the mapping gives: a default is not in it
    try:
        cfg = parser.parse_object(dict(config))
        init = instantiate_config(parser, cfg)
    except (ArgumentError, ValueError, TypeError) as err:
        raise ValueError(one_line(err)) from None
    return assemble_loop(cfg, init, output_dir, callbacks=callbacks, **overrides)
