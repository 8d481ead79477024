"""Benchmark settings from a YAML file in configs/, command-line flags overriding.

A benchmark script declares its flags with argparse as usual, plus ``--config`` whose default names its YAML file.
:func:`parse_args` reads that file first and uses its top-level keys (the flags' names with ``_``) as the defaults,
so ``python benchmarks/x.py`` runs the documented setting and ``--flag value`` changes one thing. Scripts are run as
``python benchmarks/x.py``, which puts this folder first on ``sys.path`` (opacus installs a ``benchmarks`` package
that shadows ours, so ``import benchmarks._config`` would not work).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_fl.bench.grid import read_mapping
from lightning_fl.config import build


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The YAML mapping in ``path``; a clear one-line error if it is missing or not a mapping."""
    try:
        return read_mapping(path, "file")
    except ValueError as err:
        raise SystemExit(str(err)) from None


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` with the defaults of ``parser`` replaced by the settings in its ``--config`` YAML file.

    Keys of the file that are not flags of ``parser`` are an error naming them (a typo would otherwise be ignored).
    Nested mappings in the file are not flags: the parsed namespace keeps the whole file as ``from_config``, so a
    script reads them there.
    """
    known, _ = parser.parse_known_args(argv)
    settings = read_yaml(known.config)
    flags = {action.dest for action in parser._actions}
    unknown = sorted(k for k in settings if k not in flags and not isinstance(settings[k], dict))
    if unknown:
        parser.error(f"{known.config}: unknown settings {unknown}; the flags are {sorted(flags - {'help'})}.")
    parser.set_defaults(**{k: v for k, v in settings.items() if k in flags})
    args = parser.parse_args(argv)
    args.from_config = settings
    return args


def instantiate(entry: dict[str, Any], **overrides: Any) -> Any:
    """Build ``{class_path, init_args}`` (a fit config's component) with ``overrides`` on top of its init_args."""
    return build({**entry, "init_args": {**(entry.get("init_args") or {}), **overrides}})
