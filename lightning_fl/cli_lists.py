"""One entry of a list on the command line: ``--defences.0.init_args.feature_mean 0.43``.

jsonargparse changes the *last* entry of a list of classes (``--defences.init_args.x 1``) and appends one
(``--defences+ lightning_fl.FedCDP``), but has no index syntax. This module adds it: every ``--KEY.N.PATH VALUE``
(or ``--KEY.N.PATH=VALUE``) is taken out of the arguments, the rest is parsed as usual, ``PATH`` of entry ``N`` of
the list ``KEY`` is set to ``VALUE`` (read as YAML, as jsonargparse reads values), and the arguments are parsed
once more with the whole list given, so the parser checks the new value's type.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from jsonargparse import ArgumentParser, Namespace

__all__ = ["ListEntry", "parse_with_list_entries", "split_list_entries"]

_INDEXED = re.compile(r"^--(?P<key>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*?)\.(?P<index>\d+)\.(?P<path>[A-Za-z_][\w.]*)$")


@dataclass(frozen=True)
class ListEntry:
    """``--KEY.INDEX.PATH VALUE``: set ``PATH`` (dotted) of entry ``INDEX`` of the list ``KEY`` to ``VALUE``."""

    key: str
    index: int
    path: str
    value: str


def split_list_entries(args: Sequence[str]) -> tuple[list[str], list[ListEntry]]:
    """The arguments without their ``--KEY.N.PATH VALUE`` pairs, and those pairs.

    Example:
        >>> split_list_entries(["fit", "--defences.1.init_args.sigma", "0.5", "--loop.num_rounds=3"])
        (['fit', '--loop.num_rounds=3'], [ListEntry(key='defences', index=1, path='init_args.sigma', value='0.5')])
    """
    rest: list[str] = []
    entries: list[ListEntry] = []
    items = iter(args)
    for arg in items:
        flag, equals, value = arg.partition("=")
        match = _INDEXED.match(flag)
        if match is None:
            rest.append(arg)
            continue
        if not equals:
            value = next(items, None)
            if value is None:
                raise ValueError(f"{flag} needs a value: {flag} VALUE or {flag}=VALUE.")
        entries.append(ListEntry(match["key"], int(match["index"]), match["path"], value))
    return rest, entries


def _set(entry: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for name in parents:
        entry = entry.setdefault(name, {})
        if not isinstance(entry, dict):
            raise ValueError(f"{name!r} in {path!r} is not a mapping; a list entry's keys are like init_args.NAME.")
    entry[last] = value


def _as_plain(value: Any) -> Any:
    return value.as_dict() if isinstance(value, Namespace) else value


def parse_with_list_entries(parser: ArgumentParser, args: Sequence[str]) -> Namespace:
    """Parse ``args`` with ``parser`` (which has subcommands), applying each ``--KEY.N.PATH VALUE`` to entry ``N``.

    Raises:
        ValueError: if ``KEY`` is not a list of the subcommand's config, or ``N`` is past its end.
    """
    rest, entries = split_list_entries(args)
    if not entries:
        return parser.parse_args(rest)
    cfg = parser.parse_args(rest)
    lists: dict[str, list[Any]] = {}
    for change in entries:
        if change.key not in lists:
            current = cfg[cfg.subcommand].get(change.key)
            if not isinstance(current, list):
                raise ValueError(
                    f"--{change.key}.{change.index}.{change.path}: {change.key} is not a list in this config "
                    f"(it is {type(current).__name__}); the index syntax changes one entry of a list."
                )
            lists[change.key] = [_as_plain(item) for item in current]
        target = lists[change.key]
        if not 0 <= change.index < len(target):
            raise ValueError(
                f"--{change.key}.{change.index}.{change.path}: {change.key} has {len(target)} entries (indices "
                f"0-{len(target) - 1}); append one with --{change.key}+ CLASS_PATH."
            )
        if not isinstance(target[change.index], dict):
            target[change.index] = {"class_path": target[change.index]}
        _set(target[change.index], change.path, yaml.safe_load(change.value))
    given = [f"--{key}={json.dumps(value, default=str)}" for key, value in lists.items()]
    return parser.parse_args([*rest, *given])
