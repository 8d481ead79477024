"""Settings of a benchmark script from a YAML file in ``configs/``, command-line flags overriding them.

A benchmark's documented numbers name one config file, so the settings behind a table live in one place and a
flag changes one of them for a run (docs/reproduction.md lists the commands).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import yaml

__all__ = ["parse_with_config"]


def parse_with_config(
    parser: argparse.ArgumentParser, default_config: str, args: Sequence[str] | None = None
) -> argparse.Namespace:
    """Parse ``args`` (default: the command line) with defaults read from ``--config`` (``default_config`` unless
    given).

    The YAML keys are the flags' destinations (``--batch-size`` is ``batch_size``); a flag on the command line
    wins over the file.

    Raises:
        SystemExit: naming the file and the unknown keys, when the file has keys the script does not take.

    Example:
        >>> import tempfile
        >>> parser = argparse.ArgumentParser()
        >>> _ = parser.add_argument("--seeds", nargs="+", type=int)
        >>> _ = parser.add_argument("--images", type=int)
        >>> with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        ...     _ = f.write("seeds: [3, 4]\\nimages: 2\\n")
        >>> args = parse_with_config(parser, f.name, ["--images", "7"])
        >>> args.seeds, args.images
        ([3, 4], 7)
    """
    parser.add_argument("--config", default=default_config, help="YAML with the settings; flags override it.")
    path = Path(parser.parse_known_args(args)[0].config)
    if not path.is_file():
        raise SystemExit(f"--config {path}: no such file; pass a YAML settings file (e.g. {default_config}).")
    settings = yaml.safe_load(path.read_text()) or {}
    known = {action.dest for action in parser._actions} - {"help", "config"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise SystemExit(f"--config {path}: unknown settings {unknown}; the script takes {sorted(known)}.")
    parser.set_defaults(**settings)
    return parser.parse_args(args)
