"""Benchmark settings from a YAML file in configs/, command-line flags overriding.

A benchmark's YAML is a ``lightning-fl fit`` (or ``attack``) config plus one ``sweep:`` section: its components
(``data``, ``model``, ``loop``, ``defences``, ``attack``, ...) are written exactly as a fit config writes them, and
``sweep:`` holds what the script itself varies (batch sizes, seeds, strategies, the rows of a table). A benchmark
script declares its flags with argparse as usual, plus ``--config`` whose default names its YAML file;
:func:`parse_args` takes the flags' defaults from the file's ``sweep:`` section (the flags' names with ``_``), so
``python benchmarks/x.py`` runs the documented setting and ``--flag value`` changes one thing. The file's other
sections are the fit config (``args.fit``); nested mappings of ``sweep:`` are the script's own structured settings
(``args.sweep``). Scripts are run as ``python benchmarks/x.py``, which puts this folder first on ``sys.path``
(opacus installs a ``benchmarks`` package that shadows ours, so ``import benchmarks._config`` would not work).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_fl.bench.grid import read_mapping
from lightning_fl.config import build

SWEEP = "sweep"
"""The one section of a benchmark YAML that is not part of a fit config: the script's own axes."""


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The YAML mapping in ``path``; a clear one-line error if it is missing or not a mapping."""
    try:
        return read_mapping(path, "file")
    except ValueError as err:
        raise SystemExit(str(err)) from None


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` with the defaults of ``parser`` replaced by the ``sweep:`` settings of its ``--config`` file.

    Keys of ``sweep:`` that are neither flags of ``parser`` nor mappings are an error naming them (a typo would
    otherwise be ignored); so is a flag's key outside ``sweep:`` (the fit config's sections are not flags). The
    parsed namespace keeps the ``sweep:`` section as ``sweep`` (a script reads its nested mappings there) and the
    rest of the file, the fit config, as ``fit``.
    """
    known, _ = parser.parse_known_args(argv)
    config = read_yaml(known.config)
    sweep = config.pop(SWEEP, None) or {}
    flags = {action.dest for action in parser._actions}
    outside = sorted(k for k in config if k in flags)
    if outside:
        parser.error(f"{known.config}: settings {outside} are the script's; put them under {SWEEP}:.")
    unknown = sorted(k for k in sweep if k not in flags and not isinstance(sweep[k], dict))
    if unknown:
        parser.error(f"{known.config}: unknown settings {unknown}; the flags are {sorted(flags - {'help'})}.")
    parser.set_defaults(**{k: v for k, v in sweep.items() if k in flags})
    args = parser.parse_args(argv)
    args.sweep, args.fit = sweep, config
    return args


def instantiate(entry: dict[str, Any], **overrides: Any) -> Any:
    """Build ``{class_path, init_args}`` (a fit config's component) with ``overrides`` on top of its init_args."""
    return build({**entry, "init_args": {**(entry.get("init_args") or {}), **overrides}})
