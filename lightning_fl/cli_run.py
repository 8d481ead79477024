"""Parse, build, check and run one ``lightning-fl`` subcommand (:mod:`lightning_fl.cli` hands every subcommand here).

This module builds and runs a subcommand from its parsed config (:mod:`lightning_fl.cli_parsers`); errors become
one line (:mod:`lightning_fl.cli_errors`) and signals exit codes (:mod:`lightning_fl.cli_signals`). The
top-level ``defences:`` list (``class_path``/``init_args`` of :class:`~lightning_fl.defences.Defence` bundles)
applies to any model, after it is built, and after the ``server_plugins:`` list (what a malicious server changes of
the model it ships, :class:`~lightning_fl.transforms.ServerPlugin`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse import ArgumentParser, Namespace

from lightning_fl.bench.command import prepare_bench
from lightning_fl.cli_errors import format_warning, one_line
from lightning_fl.cli_fit import assemble_loop, instantiate_config
from lightning_fl.cli_lists import parse_with_list_entries, split_list_entries
from lightning_fl.cli_parsers import SUBCOMMANDS, build_parser, data_links, record_data_links
from lightning_fl.cli_resume import check_resume_settings
from lightning_fl.cli_schema import config_files, store_schema
from lightning_fl.cli_signals import (
    EXIT_BAD_CONFIG,
    EXIT_OK,
    EXIT_RUN_FAILED,
    ignore_after_the_run,
    interrupted,
    sigterm_raises,
)
from lightning_fl.datamodules.federated import NAME_ONLY_KEYS, check_name_only_keys
from lightning_fl.defences.base import apply_defences
from lightning_fl.federation.distributed import die_with_launcher
from lightning_fl.federation.export import GLOBAL_MODEL_FILE, load_global_model, save_global_model
from lightning_fl.federation.model_contract import check_model_takes_inputs, check_train_loss_key
from lightning_fl.federation.run_dir import check_run_dir, claim_run_dir, clear_run_dir, record_written
from lightning_fl.federation.run_lock import RunLock, launched_rank
from lightning_fl.federation.workers import check_workers
from lightning_fl.transforms import apply_server_plugins
from lightning_fl.validation import (
    check_callback_schedule,
    check_checkpoints_load_safely,
    check_config_file,
    check_learning_rate,
    check_num_rounds,
    check_output_dir,
    check_resume,
    check_trainer_options,
)

__all__ = ["build_parser", "main"]


def _check_fit(cfg: Namespace, init: Namespace) -> None:
    """Checks of a fit config that need no training (STYLE.md R3); each raises one line naming the key."""
    lr = getattr(init.model, "lr", None)
    if isinstance(lr, float | int):
        check_learning_rate(float(lr))
    check_num_rounds(cfg.loop.num_rounds)
    check_trainer_options(cfg.loop.trainer or {})
    data, steps = init.data, cfg.loop.local_steps
    if steps is None:
        steps = cfg.loop.local_epochs * max(len(data.train_dataloader(k)) for k in range(data.num_clients))
    callbacks = init.loop.callbacks or ()
    check_callback_schedule(
        callbacks, num_rounds=cfg.loop.num_rounds, num_clients=data.num_clients, max_local_steps=steps
    )


def _resolved_config(cfg: Namespace) -> dict[str, Any]:
    """The resolved config as plain data (``wandb.config``): what ``--print_config`` prints."""
    return {k: v for k, v in cfg.clone().as_dict().items() if k != "config"}


_NAME_ONLY_DATA_KEYS = (*NAME_ONLY_KEYS, "download")
"""Keys of ``data:`` that only a dataset name or ImageFolder path uses (see ``FederatedDataModule``)."""


def _check_given_data_keys(parser: ArgumentParser, args: list[str], cfg: Namespace) -> None:
    """A name-only ``data`` key given with a user's Dataset or DataModule exits 2 (:func:`check_name_only_keys`):
    judged on what the config files and the command line give, parsed again without the defaults (the default
    ``data.image_size`` reads the same as one given)."""
    data = cfg[cfg.subcommand].get("data")
    dataset = data.get("dataset") if isinstance(data, Namespace) else None
    if dataset is None or isinstance(dataset, str):  # a name or a folder; the bench checks its grid's runs
        return
    given = parser.parse_args(split_list_entries(args)[0], defaults=False)[cfg.subcommand].get("data")
    check_name_only_keys(dataset, given.as_dict() if isinstance(given, Namespace) else {})


_PRINT_CONFIG = "--print_config"
"""The flag that prints the resolved config instead of running it (:func:`_print_config`)."""


def _runnable_config(cfg: Namespace) -> Namespace:
    """A copy of a subcommand's config without the ``data`` keys its source does not use (a Dataset or
    LightningDataModule takes no name-only key: given, they exit 2), so that running it again accepts it."""
    runnable = cfg.clone()
    data = runnable.get("data")
    if isinstance(data, Namespace) and data.get("dataset") is not None and not isinstance(data.dataset, str):
        for key in _NAME_ONLY_DATA_KEYS:
            if key in data:
                del data[key]
    return runnable


def _saved_config(cfg: Namespace) -> Namespace:
    """The config a run records: its settings, without what it did to the directory (``resume``, ``overwrite``),
    so that ``fit -c <run>/config.yaml --output_dir <new>`` runs it again."""
    saved = _runnable_config(cfg)
    saved.resume, saved.overwrite = False, False
    return saved


def _print_config(cfg: Namespace, flags: list[str]) -> None:
    """``--print_config[=skip_null]`` (``flags``): print the resolved config of ``cfg``'s subcommand as a file that
    ``-c`` runs again (:func:`_runnable_config`), and exit with 0 through ``SystemExit``."""
    printed = _runnable_config(cfg[cfg.subcommand])
    if "config" in printed:
        del printed["config"]
    skip_null = any("skip_null" in flag.partition("=")[2] for flag in flags)
    print(SUBCOMMANDS[cfg.subcommand]().dump(printed, skip_none=skip_null), end="")
    raise SystemExit(0)


def _prepare_fit(parser: ArgumentParser, cfg: Namespace) -> Callable[[], dict[str, Any]]:
    """Build and check everything of a fit run; the returned call trains and is the first to write."""
    check_output_dir(cfg.output_dir)
    output_dir, rank = Path(cfg.output_dir), launched_rank()  # a DDP rank shares its launcher's directory
    if not rank:
        check_run_dir(output_dir, resume=cfg.resume, overwrite=cfg.overwrite)
    init = instantiate_config(parser, cfg)
    _check_fit(cfg, init)
    links = data_links(cfg.model.get("init_args"), init.data)
    overridden = [f"model.init_args.{k}={new!r} (instead of {old!r})" for k, (old, new) in links.items() if old != new]
    if overridden and not rank:
        print(f"taken from the data: {', '.join(overridden)}")
    loop = assemble_loop(cfg, init, output_dir)
    check_resume(cfg.resume, loop.checkpoint.manifest_path)
    check_workers(
        loop.workers,
        trainer_options=loop.process_options,
        client_callbacks=loop.client_callbacks,
        backend=loop.backend,
        ranks=loop.ranks,
        taps_local_gradients=bool(loop.leaks.listeners("on_local_gradient")),
    )
    saved = _saved_config(cfg)
    loop.recorder.config = _resolved_config(saved)
    check_model_takes_inputs(loop.global_model, init.data.train_dataloader(0))
    manifest = loop.checkpoint.read_manifest() if cfg.resume else None
    if manifest is not None:  # a refusal names the changed keys as config.yaml and the command line write them
        config = _resolved_config(saved)
        config["model"].setdefault("init_args", {}).update({k: new for k, (_, new) in links.items()})
        fingerprint = loop.checkpoint.fingerprint(loop.parts)
        check_resume_settings(output_dir, stored=manifest.get("fingerprint", {}), current=fingerprint, config=config)
    if cfg.resume:
        # digests first (a truncated file is named as such), then the safe unpickler; uncommitted files are
        # deleted unread
        check_checkpoints_load_safely(loop.checkpoint.check_committed())
    loop.prepare(resume=cfg.resume)  # component checks, resume checks and the eval_metric check: errors give 2
    options = loop.runner.trainer_options
    check_train_loss_key(
        loop.global_model, init.data.train_dataloader(0), key=cfg.loop.train_loss_key, trainer_options=options
    )
    if not rank:
        claim_run_dir(loop.lock, resume=cfg.resume, overwrite=cfg.overwrite)  # the last check, the first write

    def fit() -> dict[str, Any]:
        try:
            if not rank:
                if cfg.overwrite:
                    clear_run_dir(output_dir)
                parser.save(saved, output_dir / "config.yaml", overwrite=True, skip_validation=True)
                record_data_links(output_dir / "config.yaml", {k: new for k, (_, new) in links.items()})
            summary = loop.fit(resume=cfg.resume)
        finally:
            loop.lock.release()
        if not summary:  # a DDP rank other than 0: rank 0 reports
            return summary
        rounds = str(summary["rounds_completed"])
        save_global_model(loop.global_model, output_dir / GLOBAL_MODEL_FILE, metadata={"rounds_completed": rounds})
        record_written(output_dir, GLOBAL_MODEL_FILE)  # written after the lock: one of the run's files all the same
        print(f"rounds completed: {summary['rounds_completed']}, test accuracy: {summary['test_accuracy']}")
        if loop.vectorised.decision is not None:
            print(
                f"vectorised client fit (loop.vectorize={str(cfg.loop.vectorize).lower()}): {loop.vectorised.decision}"
            )
        print(f"summary: {output_dir / 'summary.json'}")
        return summary

    return fit


def _prepare_attack(parser: ArgumentParser, cfg: Namespace) -> Callable[[], dict[str, Any]]:
    """Build and check one standalone attack; the returned call runs it and is the first to write."""
    from rich.console import Console
    from rich.table import Table

    from lightning_fl.attacks.standalone import check_attack_run, run_attack

    check_output_dir(cfg.output_dir)
    output_dir = Path(cfg.output_dir)
    check_run_dir(output_dir, resume=False, overwrite=cfg.overwrite, can_resume=False)
    init = instantiate_config(parser, cfg)
    apply_server_plugins(init.model, init.server_plugins, data=init.data)
    apply_defences(init.model, init.defences, data=init.data)
    if cfg.ckpt_path is not None:  # a trained global model: the defended model's public keys are what fit exported
        load_global_model(init.model, cfg.ckpt_path)
    check_attack_run(init.attack, data=init.data, model=init.model, run=init.run)
    check_model_takes_inputs(init.model, init.data.train_dataloader(init.run.client_id))
    lock = RunLock(output_dir)
    claim_run_dir(lock, resume=False, overwrite=cfg.overwrite, can_resume=False)  # the last check, the first write

    def attack() -> dict[str, Any]:
        try:
            if cfg.overwrite:
                clear_run_dir(output_dir)
            saved = cfg.clone()
            saved.overwrite = False
            parser.save(saved, output_dir / "config.yaml", overwrite=True, skip_validation=True)
            entry = run_attack(
                init.attack,
                data=init.data,
                model=init.model,
                run=init.run,
                output_dir=output_dir,
                seed=cfg.seed_everything,
            )
        finally:
            lock.release()
        totals = json.loads((output_dir / "summary.json").read_text()).get("totals")  # more than one image
        shown = totals or entry
        count = shown["num_images"]
        table = Table("metric", "value", title=f"{shown['attack']} on {count} image(s), means over all {count}")
        if totals:
            for key in ("psnr", "ssim"):
                low, high = totals[f"{key}_interval"]
                table.add_row(key, f"{totals[key]:.4g} (95% CI {low:.4g}-{high:.4g})")
            table.add_row(f"share at SSIM >= {totals['success_ssim']}", f"{totals['share_recovered']:.3g}")
            table.add_row("... and above its own mean colour", f"{totals['share_beyond_colour']:.3g}")
            table.add_row("SSIM of the own mean colours", f"{totals['own_colour_ssim']:.4g}")
            keys: tuple[str, ...] = ("label_accuracy", "seconds")
        else:
            keys = ("mse", "psnr", "ssim", "lpips", "label_accuracy", "psnr_ref_rmse", "seconds")
        for key in keys:
            table.add_row(key, "null" if shown[key] is None else f"{shown[key]:.4g}")
        for key, text in _COUNTS.items():
            table.add_row(text, f"{shown[key]} of {count}")
        Console().print(table)
        if "attacked" in entry:
            print(f"attacked: {', '.join(map(str, entry['attacked']))}")
            print(f"comparison grid: {entry['image']}")
        print(f"summary: {output_dir / 'summary.json'}")
        return entry

    return attack


_COUNTS = {
    "reconstructed": "reconstructed (rest: grey guess)",
    "recovered": "recovered (PSNR >= 30 dB)",
    "psnr_capped": "PSNR at 100 dB cap (counted 100)",
}
"""The counts the ``attack`` command prints under its scores, out of the attacked images."""


def _prepare_evaluate(stage: str) -> Callable[[ArgumentParser, Namespace], Callable[[], list[dict[str, float]]]]:
    """``validate``/``test``: the fit config's model and data, with the saved public global state loaded."""

    def prepare(parser: ArgumentParser, cfg: Namespace) -> Callable[[], list[dict[str, float]]]:
        from torch.utils.data import ConcatDataset, DataLoader

        from lightning_fl.federation.checkpoint import Checkpoint
        from lightning_fl.federation.evaluation import mean_over_clients, trained_clients
        from lightning_fl.trainers import build_trainer, trainer_options

        init = instantiate_config(parser, cfg)
        # the defended model's public keys are what fit exported
        apply_server_plugins(init.model, init.server_plugins, data=init.data)  # the model the server shipped,
        apply_defences(init.model, init.defences, data=init.data)  # defended: the keys that fit exported
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
    warnings.formatwarning = format_warning


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lightning-fl``; returns the exit code.

    Exit codes: 0 done; 2 bad config (parsing, building or checking it failed, e.g. a data set that cannot be
    loaded; nothing was written, no run directory was created); 1 the run failed after it started (one line;
    ``LIGHTNING_FL_TRACEBACK=1`` gives the traceback); 130 interrupted (Ctrl+C), 143 terminated (SIGTERM): the
    last completed round is committed and ``--resume true`` continues from it. ``--help`` and
    ``--print_config`` exit with 0 through ``SystemExit``.
    Warning filters and format, and the SIGINT and SIGTERM handlers, are set for the call only and restored
    afterwards; run as the ``lightning-fl`` command, both signals are ignored once the exit code is known.
    """
    die_with_launcher()  # a DDP rank this command re-ran: it ends with its launcher
    args = list(sys.argv[1:] if argv is None else argv)
    format_before = warnings.formatwarning
    try:
        with warnings.catch_warnings(), sigterm_raises():
            _quiet()
            try:
                return _main(args)
            finally:
                warnings.formatwarning = format_before
    finally:
        ignore_after_the_run()


def _known_keys(args: list[str]) -> list[str]:
    """Every config key of the subcommand in ``args`` (for a suggestion when a key is unknown)."""
    subcommand = next((arg for arg in args if arg in SUBCOMMANDS), None)
    if subcommand is None:
        return []
    return [action.dest for action in SUBCOMMANDS[subcommand]()._actions if not action.dest.endswith(".help")]


def _main(args: list[str]) -> int:
    try:
        for path in config_files(args):
            check_config_file(path)
        parser = build_parser()
        store_schema(parser._subcommands_action._name_parser_map)  # what the next --help or typo answers from
        printing = [arg for arg in args if arg.partition("=")[0] == _PRINT_CONFIG and args[:1] != ["bench"]]
        given = [arg for arg in args if arg not in printing]
        cfg = parse_with_list_entries(parser, given)
        _check_given_data_keys(parser, given, cfg)
        if printing:
            _print_config(cfg, printing)
        run = RUNNERS[cfg.subcommand](SUBCOMMANDS[cfg.subcommand](), cfg[cfg.subcommand])
    except KeyboardInterrupt as err:
        return interrupted(err)
    except Exception as err:  # anything before training (parse, build, checks) rejects the config: nothing ran
        print(
            f"lightning-fl: error: {one_line(err, known_keys=lambda: _known_keys(args), where=True)}", file=sys.stderr
        )
        return EXIT_BAD_CONFIG
    try:
        run()
    except KeyboardInterrupt as err:
        return interrupted(err, getattr(run, "resume_hint", None))
    except SystemExit as err:  # Lightning turns Ctrl+C inside Trainer.fit into sys.exit(1)
        if isinstance(err.__context__, KeyboardInterrupt):
            return interrupted(err.__context__, getattr(run, "resume_hint", None))
        raise
    except Exception as err:
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        print(
            f"lightning-fl: error: run failed: {type(err).__name__}: {one_line(err)} "
            f"(set {TRACEBACK_ENV}=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_RUN_FAILED
    return EXIT_OK
