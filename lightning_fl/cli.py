"""The ``lightning-fl`` command: ``fit`` (federated training), ``attack`` (one attack on one batch), ``bench``
(every attack against every defence, :mod:`lightning_fl.bench`), ``validate`` / ``test`` (a saved public global
model, ``global_model.safetensors``, on the validation or test data).

Configs follow jsonargparse / LightningCLI conventions: every key of a YAML config can also be given on the
command line (``--loop.num_rounds 5``), classes are chosen with ``class_path``/``init_args``, and
``--print_config`` prints the resolved config. The model's ``num_classes``, ``in_channels``, ``image_size``,
``input_mean`` and ``input_std`` are linked from the data when the model's ``__init__`` takes them. The
top-level ``defences:`` list (``class_path``/``init_args`` of :class:`~lightning_fl.defences.Defence` bundles)
applies to any model, after it is built.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import logging
import os
import re
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from lightning_fl.bench.command import bench_parser, prepare_bench
from lightning_fl.datamodules.federated import FederatedDataModule
from lightning_fl.defences.base import Defence, apply_defences
from lightning_fl.federation.export import GLOBAL_MODEL_FILE, load_global_model, save_global_model
from lightning_fl.federation.loop import FederatedLoop
from lightning_fl.validation import (
    check_callback_schedule,
    check_checkpoints_load_safely,
    check_learning_rate,
    check_num_rounds,
    check_output_dir,
    check_resume,
    check_trainer_options,
)

__all__ = ["build_parser", "main"]

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
    for key in _DATA_LINKS:
        parser.link_arguments(
            "data", f"model.init_args.{key}", compute_fn=partial(_model_option, key=key), apply_on="instantiate"
        )


def _model_option(data: FederatedDataModule, key: str) -> Any:
    return data.model_options[key]


def _fit_parser() -> ArgumentParser:
    parser = ArgumentParser(description="Federated training with per-client Lightning Trainers.", allow_abbrev=False)
    _common(parser)
    parser.add_argument("--resume", type=bool, default=False, help="Continue from the last completed round.")
    parser.add_class_arguments(
        FederatedLoop, "loop", skip={"model", "datamodule", "defences", "output_dir", "seed"}, instantiate=False
    )
    return parser


def _attack_parser() -> ArgumentParser:
    from lightning_fl.attacks.base import GradientAttack
    from lightning_fl.attacks.standalone import run_attack

    parser = ArgumentParser(
        description="One gradient-leakage attack on one batch of a client's data (no rounds).", allow_abbrev=False
    )
    _common(parser)
    parser.add_subclass_arguments(GradientAttack, "attack", required=True)
    parser.add_function_arguments(run_attack, "run", skip={"attack", "data", "model", "output_dir", "seed"})
    return parser


def _evaluate_parser(stage: str) -> Callable[[], ArgumentParser]:
    def build() -> ArgumentParser:
        parser = _fit_parser()
        where = "the test set" if stage == "test" else "the clients' validation splits, pooled"
        parser.description = f"{stage.capitalize()} a saved public global model ({GLOBAL_MODEL_FILE}) on {where}."
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
    parser = ArgumentParser(
        prog="lightning-fl", description=__doc__.splitlines()[0], exit_on_error=False, allow_abbrev=False
    )
    subcommands = parser.add_subcommands(required=True, dest="subcommand")
    for name, build in SUBCOMMANDS.items():
        sub = build()
        subcommands.add_subcommand(name, sub, help=sub.description)
    return parser


def _instantiate(parser: ArgumentParser, cfg: Namespace) -> Namespace:
    """Build data first (so links can read it), then everything else, seeded."""
    L.seed_everything(cfg.seed_everything, verbose=False)
    cfg.data.seed = cfg.data.seed if cfg.data.seed else cfg.seed_everything
    return parser.instantiate(cfg)


def _check_fit(cfg: Namespace, init: Namespace) -> None:
    """Checks of a fit config that need no training (STYLE.md R3); each raises one line naming the key."""
    lr = getattr(init.model, "lr", None)
    if isinstance(lr, float | int):
        check_learning_rate(float(lr))
    check_num_rounds(cfg.loop.num_rounds)
    check_trainer_options(cfg.loop.trainer or {})
    callbacks = init.loop.callbacks or ()
    check_callback_schedule(callbacks, num_rounds=cfg.loop.num_rounds, num_clients=init.data.num_clients)


def _resolved_config(cfg: Namespace) -> dict[str, Any]:
    """The resolved config as plain data (``wandb.config``): what ``--print_config`` prints."""
    return {k: v for k, v in cfg.clone().as_dict().items() if k != "config"}


def _prepare_fit(parser: ArgumentParser, cfg: Namespace) -> Callable[[], dict[str, Any]]:
    """Build and check everything of a fit run; the returned call trains and is the first to write."""
    output_dir = Path(cfg.output_dir)
    check_output_dir(output_dir)
    init = _instantiate(parser, cfg)
    _check_fit(cfg, init)
    loop = FederatedLoop(
        init.model,
        init.data,
        defences=init.defences,
        output_dir=output_dir,
        seed=cfg.seed_everything,
        **vars(init.loop),
    )
    check_resume(cfg.resume, loop.checkpoint.manifest_path)
    loop.recorder.config = _resolved_config(cfg)
    if cfg.resume:
        check_checkpoints_load_safely(loop.checkpoint.committed_files())  # an uncommitted file is deleted unread
    loop.prepare(resume=cfg.resume)  # component checks, resume checks and the eval_metric check: errors give 2

    def fit() -> dict[str, Any]:
        output_dir.mkdir(parents=True, exist_ok=True)
        parser.save(cfg, output_dir / "config.yaml", overwrite=True, skip_validation=True)
        summary = loop.fit(resume=cfg.resume)
        if not summary:  # a DDP rank other than 0: rank 0 reports
            return summary
        rounds = str(summary["rounds_completed"])
        save_global_model(loop.global_model, output_dir / GLOBAL_MODEL_FILE, metadata={"rounds_completed": rounds})
        print(f"rounds completed: {summary['rounds_completed']}, test accuracy: {summary['test_accuracy']}")
        print(f"summary: {output_dir / 'summary.json'}")
        return summary

    return fit


def _prepare_attack(parser: ArgumentParser, cfg: Namespace) -> Callable[[], dict[str, Any]]:
    """Build and check one standalone attack; the returned call runs it and is the first to write."""
    from rich.console import Console
    from rich.table import Table

    from lightning_fl.attacks.standalone import run_attack

    output_dir = Path(cfg.output_dir)
    check_output_dir(output_dir)
    init = _instantiate(parser, cfg)
    apply_defences(init.model, init.defences)

    def attack() -> dict[str, Any]:
        output_dir.mkdir(parents=True, exist_ok=True)
        parser.save(cfg, output_dir / "config.yaml", overwrite=True, skip_validation=True)
        entry = run_attack(
            init.attack,
            data=init.data,
            model=init.model,
            output_dir=output_dir,
            seed=cfg.seed_everything,
            **vars(init.run),
        )
        table = Table("metric", "value", title=f"{entry['attack']} on {entry['num_images']} image(s)")
        for key in ("mse", "psnr", "ssim", "lpips", "label_accuracy", "psnr_ref_rmse", "recovered", "seconds"):
            table.add_row(key, "null" if entry[key] is None else f"{entry[key]:.4g}")
        Console().print(table)
        print(f"attacked: {', '.join(map(str, entry['attacked']))}")
        print(f"comparison grid: {entry['image']}")
        print(f"summary: {output_dir / 'summary.json'}")
        return entry

    return attack


def _prepare_evaluate(stage: str) -> Callable[[ArgumentParser, Namespace], Callable[[], list[dict[str, float]]]]:
    """``validate``/``test``: the fit config's model and data, with the saved public global state loaded."""

    def prepare(parser: ArgumentParser, cfg: Namespace) -> Callable[[], list[dict[str, float]]]:
        from torch.utils.data import ConcatDataset, DataLoader

        from lightning_fl.federation.checkpoint import Checkpoint
        from lightning_fl.federation.evaluation import mean_over_clients, trained_clients
        from lightning_fl.federation.trainers import build_trainer, trainer_options

        init = _instantiate(parser, cfg)
        apply_defences(init.model, init.defences)  # the defended model's public keys are what fit exported
        load_global_model(init.model, cfg.ckpt_path or Path(cfg.output_dir) / GLOBAL_MODEL_FILE)
        data = init.data
        if stage == "test":
            loader = data.test_dataloader()
        else:
            pooled = ConcatDataset([data.client_val_set(k) for k in range(data.num_clients)])
            if len(pooled) == 0:
                raise ValueError("validate needs validation data: set data.val_fraction > 0 (or use `test`).")
            loader = DataLoader(pooled, batch_size=data.eval_batch_size)
        trainer = build_trainer(trainer_options(cfg.loop.trainer), validate=stage == "validate")
        clients = trained_clients(init.model, Checkpoint(cfg.output_dir))  # a personalised model: its clients' own

        def evaluate() -> list[dict[str, float]]:
            run = trainer.test if stage == "test" else trainer.validate

            def score(model: L.LightningModule) -> dict[str, float]:
                return run(model, dataloaders=loader, verbose=False)[0]

            results = mean_over_clients(init.model, clients, score) if clients else score(init.model)
            if clients:
                print(f"mean over the {len(clients)} trained clients' own models (public state + private layers):")
            for key, value in results.items():
                print(f"{key}: {value:.4f}")
            return [results]

        return evaluate

    return prepare


RUNNERS: dict[str, Callable[[ArgumentParser, Namespace], Callable[[], Any]]] = {
    "fit": _prepare_fit,
    "attack": _prepare_attack,
    "bench": prepare_bench,
    "validate": _prepare_evaluate("validate"),
    "test": _prepare_evaluate("test"),
}
"""Per subcommand: build and check a run from its config (errors here exit with 2), return the call that runs it."""

EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_CONFIG, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143
"""Exit codes of ``lightning-fl``: 2 only before anything is written; 130 = 128 + SIGINT and 143 = 128 + SIGTERM,
as shells report them."""

TRACEBACK_ENV = "LIGHTNING_FL_TRACEBACK"
"""Set to 1 to get the full traceback of a run-time failure instead of its one-line summary."""

_THIRD_PARTY_NOISE = (r"lightning\.pytorch\.", r"lightning\.fabric\.", r"torch\.utils\.data\.")
"""Modules (exact packages, not prefixes of names: ``lightning`` would also match ``lightning_fl``) whose warnings
the command hides. The toolkit's own warnings (dropped clients, clipped values, skipped attacks) stay visible."""


def _quiet() -> None:
    os.environ.setdefault("WANDB_MODE", "offline")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for module in _THIRD_PARTY_NOISE:
        warnings.filterwarnings("ignore", module=module)
    warnings.formatwarning = _format_warning


def _format_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> str:
    """One line per warning, like the errors: ``lightning-fl: warning: <message>``."""
    return f"lightning-fl: warning: {' '.join(str(message).split())}\n"


_PARSER_KEY = re.compile(r'Parser key "([^"]+)"')
_CLASS_PATH = re.compile(r"Problem with given class_path '([^']+)'")
_NOT_ACCEPTED = re.compile(r"Option '([^']+)' is not accepted")
_EXPECTED = re.compile(r"Expected a (.+?)\. Got value: (.*)$")
_UNION_ALTERNATIVE = re.compile(r"^\s*- Expected a (.+?)\.?\s*$", re.MULTILINE)


def _type_name(annotation: str) -> str:
    """``<class 'int'>`` -> ``an integer``; ``typing.Literal['a', 'b']`` -> ``one of 'a', 'b'``."""
    if annotation.startswith("typing.Literal[") and annotation.endswith("]"):
        return f"one of {annotation[len('typing.Literal[') : -1]}"
    name = re.sub(r"<class '(?:[\w.]*\.)?(\w+)'>", r"\1", annotation).replace("NoneType", "null")
    return {"int": "an integer", "float": "a number", "bool": "true or false", "dict": "a mapping"}.get(name, name)


def _chain(err: BaseException) -> list[BaseException]:
    chain = [err]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    return chain


def _one_line(err: BaseException) -> str:
    """The most specific message of ``err`` on one line, with the full config key when jsonargparse knows it.

    jsonargparse nests its errors (``Parser key "model"`` wraps ``Parser key "optimizer"`` of the chosen class);
    the keys are joined back into ``model.init_args.optimizer`` and its ``Expected a <type>. Got value: v`` is
    turned into ``model.init_args.optimizer='v' is invalid: expected one of 'adam', 'sgd'.``
    """
    chain = _chain(err)
    keys: list[str] = []
    for link in chain:
        match = _PARSER_KEY.match(str(link))
        if match and (not keys or keys[-1] != match.group(1)):
            keys.append(match.group(1))
    last = chain[-1]
    innermost = " ".join(str(last.args[0] if isinstance(last, KeyError) and last.args else last).split())
    expected = _EXPECTED.search(innermost)
    if keys and expected:
        key = ".init_args.".join(keys)
        value = expected.group(2)
        union = str(chain[-2]) if len(chain) > 1 else ""
        alternatives = [_type_name(t) for t in _UNION_ALTERNATIVE.findall(union)]
        if "Problem with given class_path" in union or not alternatives:
            alternatives = [_type_name(expected.group(1))]
        message = f"{key}={value!r} is invalid: expected {' or '.join(alternatives)}."
        if "a mapping" in alternatives and ":" in value:
            message += " On the command line write a YAML mapping with a space after each colon: '{accelerator: cpu}'."
        return message
    if keys:
        return _keyed(".init_args.".join(keys), innermost, chain)
    return innermost.split(" failed: ", 1)[-1]


def _keyed(key: str, innermost: str, chain: list[BaseException]) -> str:
    """Name ``key`` in a jsonargparse message that lacks it (unknown init option, bad class_path, missing file)."""
    class_path = next((m.group(1) for link in chain if (m := _CLASS_PATH.match(str(link)))), None)
    option = _NOT_ACCEPTED.search(innermost)
    if option and class_path:
        name = option.group(1)
        try:
            module, _, attr = class_path.rpartition(".")
            known = inspect.signature(getattr(importlib.import_module(module), attr)).parameters
        except (ImportError, AttributeError, ValueError, TypeError):
            known = {}
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        return f"{key}.init_args.{name} is not an option of {class_path}{hint}"
    if re.search(rf"(?<![\w./]){re.escape(key)}(?![\w./])", innermost):  # the key itself, not in a path
        return innermost
    where = f" (class_path {class_path!r})" if class_path else ""
    return f"{key}{where}: {innermost}"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl+C: the run stops between two writes (a checkpoint commit holds it until done)."""


def _raise_terminated(*_: object) -> None:
    raise Terminated


def _interrupted(err: BaseException | None = None, resume_hint: str | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Lightning ignores SIGINT after the first one
    what = "terminated" if isinstance(err, Terminated) else "interrupted"
    hint = resume_hint or "a fit run continues from its last completed round with --resume true"
    print(f"lightning-fl: {what}; {hint}.", file=sys.stderr)
    return EXIT_TERMINATED if isinstance(err, Terminated) else EXIT_INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lightning-fl``; returns the exit code.

    Exit codes: 0 done; 2 bad config (parsing, building or checking it failed, e.g. a data set that cannot be
    loaded; nothing was written, no run directory was created); 1 the run failed after it started (one line;
    ``LIGHTNING_FL_TRACEBACK=1`` gives the traceback); 130 interrupted (Ctrl+C), 143 terminated (SIGTERM): the
    last completed round is committed and ``--resume true`` continues from it. ``--help`` and
    ``--print_config`` exit with 0 through ``SystemExit``.
    Warning filters and format, and the SIGTERM handler, are set for the call only and restored afterwards.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    format_before = warnings.formatwarning
    main_thread = threading.current_thread() is threading.main_thread()
    sigterm_before = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    with warnings.catch_warnings():
        _quiet()
        try:
            return _main(args)
        finally:
            warnings.formatwarning = format_before
            if main_thread:
                signal.signal(signal.SIGTERM, sigterm_before)


def _main(args: list[str]) -> int:
    try:
        parser = build_parser()
        cfg = parser.parse_args(args)
        run = RUNNERS[cfg.subcommand](SUBCOMMANDS[cfg.subcommand](), cfg[cfg.subcommand])
    except KeyboardInterrupt as err:
        return _interrupted(err)
    except Exception as err:  # anything before training (parse, build, checks) rejects the config: nothing ran
        print(f"lightning-fl: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    try:
        run()
    except KeyboardInterrupt as err:
        return _interrupted(err, getattr(run, "resume_hint", None))
    except SystemExit as err:  # Lightning turns Ctrl+C inside Trainer.fit into sys.exit(1)
        if isinstance(err.__context__, KeyboardInterrupt):
            return _interrupted(err.__context__, getattr(run, "resume_hint", None))
        raise
    except Exception as err:
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        print(
            f"lightning-fl: error: run failed: {type(err).__name__}: {_one_line(err)} "
            f"(set {TRACEBACK_ENV}=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_RUN_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
