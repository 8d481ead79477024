"""What ``lightning-fl SUBCOMMAND`` knows before it imports Lightning: a cache of each subcommand's keys and help.

jsonargparse builds a subcommand's parser from the classes it configures (``FederatedLoop``,
``FederatedDataModule``, ``LightningModule`` subclasses), so building it imports torch and Lightning. What a
``--help`` or a misspelt key needs of that parser does not change until the code or the libraries do: the first
command that builds the parser stores each subcommand's help text (80 columns wide, as piped output is), its keys,
and the keys under which any sub-key is accepted (a class's ``init_args``, a dict), in one JSON file under
``$LIGHTNING_FL_CACHE_DIR`` (default ``~/.cache/lightning-fl``), with the fingerprint of the package's sources and of
the Python and library versions (:func:`~lightning_fl.code_fingerprint.code_fingerprint`). Later commands answer a
bare ``SUBCOMMAND --help`` and reject an unknown key (on the command line or in a ``-c`` config) from that file when
its fingerprint is current; anything else, and any doubt, goes to the parser.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_fl.cli_errors import with_suggestion
from lightning_fl.cli_signals import EXIT_BAD_CONFIG, EXIT_OK
from lightning_fl.code_fingerprint import code_fingerprint

__all__ = [
    "CACHE_ENV",
    "HELP_COLUMNS",
    "answer_from_cache",
    "cached_schema",
    "config_files",
    "parser_schema",
    "store_schema",
    "unknown_key",
]

CACHE_ENV = "LIGHTNING_FL_CACHE_DIR"
"""Directory of the cached schema (default ``~/.cache/lightning-fl``); an empty value turns the cache off."""
HELP_COLUMNS = 80
"""Width of the cached help texts: what the parser prints when its output is not a terminal."""
_FILE = "cli-schema.json"
_SCALARS = (int, float, str, bool, type(None), Path)
_INDEXED = re.compile(r"^(?P<key>.+?)\.\d+(?:\..*)?$")  # --defences.0.init_args.x (lightning_fl.cli_lists)
_HELP_FLAGS = ("-h", "--help")


def _cache_file() -> Path | None:
    directory = os.environ.get(CACHE_ENV, str(Path.home() / ".cache" / "lightning-fl"))
    return Path(directory) / _FILE if directory else None


def _open(typehint: Any) -> bool:
    """Whether a key of this type takes sub-keys (a class's ``init_args``, a dict); scalars and their unions do not.

    Example:
        >>> _open(int | None), _open(typing.Literal["a", "b"]), _open(dict[str, Any]), _open(list[int])
        (False, False, True, False)
    """
    origin = typing.get_origin(typehint)
    if origin is typing.Literal or typehint in _SCALARS:
        return False
    if origin in (typing.Union, types.UnionType, list, tuple, Sequence):  # open when one alternative or item is
        return any(_open(arg) for arg in typing.get_args(typehint))
    return True


def parser_schema(parser: Any) -> dict[str, Any]:
    """One subcommand's schema from its jsonargparse ``parser``: ``help`` (at :data:`HELP_COLUMNS`), ``flags`` (every
    long option), ``keys`` (every config key, for suggestions) and ``open`` (keys that take any sub-key)."""
    flags, keys, open_keys = set(), [], []
    for action in parser._actions:
        flags.update(s for s in action.option_strings if s.startswith("--"))
        if action.dest.endswith(".help") or action.dest == "help":
            continue
        keys.append(action.dest)
        if getattr(action, "_typehint", None) is not None and _open(action._typehint):
            open_keys.append(action.dest)
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)  # argparse wraps at the terminal's width
    try:
        text = parser.format_help()
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return {"help": text, "flags": sorted(flags), "keys": keys, "open": open_keys}


def store_schema(subcommands: Mapping[str, Any]) -> None:
    """Write the schema of every subcommand's parser (``{name: parser}``) to the cache, unless it is current; a
    cache that cannot be written is left alone (the next command builds the parser again)."""
    path = _cache_file()
    if path is None or cached_schema() is not None:
        return
    schema = {"fingerprint": code_fingerprint(), "subcommands": {k: parser_schema(p) for k, p in subcommands.items()}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(json.dumps(schema))
        os.replace(partial, path)
    except OSError:
        return


def cached_schema() -> dict[str, Any] | None:
    """The cached schema when it was stored by this code with these libraries, else ``None``."""
    path = _cache_file()
    try:
        schema = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    if not isinstance(schema, dict) or schema.get("fingerprint") != code_fingerprint():
        return None
    return schema


def _known(flag: str, schema: Mapping[str, Any]) -> bool:
    key = flag[2:].rstrip("+")
    indexed = _INDEXED.match(key)
    key = indexed["key"] if indexed else key
    if f"--{key}" in schema["flags"]:
        return True
    return any(key.startswith(f"{prefix}.") for prefix in schema["open"])


def _unknown_yaml_key(config: Mapping[str, Any], schema: Mapping[str, Any], prefix: str = "") -> str | None:
    """The first key of a ``-c`` config (nested mappings as dotted keys) that the subcommand does not have."""
    for name, value in config.items():
        key = f"{prefix}{name}"
        if str(name).startswith("__") or any(key == o or key.startswith(f"{o}.") for o in schema["open"]):
            continue
        if isinstance(value, dict) and any(k.startswith(f"{key}.") for k in schema["keys"]):  # a group: data, loop
            found = _unknown_yaml_key(value, schema, f"{key}.")
            if found:
                return found
        elif key not in schema["keys"]:
            return key
    return None


def config_files(args: Sequence[str]) -> list[str]:
    """The files of ``-c`` / ``--config`` in a command's ``args`` (none for ``bench``, which reads its own format).

    Example:
        >>> config_files(["fit", "-c", "a.yaml", "--config=b.yaml"]), config_files(["bench", "-c", "grid.yaml"])
        (['a.yaml', 'b.yaml'], [])
    """
    if args[:1] == ["bench"]:
        return []
    files = [value for flag, value in itertools.pairwise(args) if flag in ("-c", "--config")]
    return files + [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]


def unknown_key(subcommand: str, args: Sequence[str], schema: Mapping[str, Any]) -> str | None:
    """The parser's message for the first key in ``args`` (after the subcommand) or in their ``-c`` configs that
    ``subcommand`` does not have, with the nearest known key; ``None`` when every key may be known.

    Example:
        >>> schema = {"flags": ["--loop.num_rounds", "--model"], "keys": ["loop.num_rounds", "model"],
        ...           "open": ["model"]}
        >>> unknown_key("fit", ["--model.init_args.lr", "0.1", "--loop.num_roundz", "3"], schema)
        'unrecognized arguments: --loop.num_roundz 3; did you mean --loop.num_rounds?'
    """
    known = schema["keys"]
    for position, arg in enumerate(args):
        flag = arg.partition("=")[0]
        if flag.startswith("--") and not _known(flag, schema):
            value = args[position + 1] if "=" not in arg and position + 1 < len(args) else ""
            shown = arg if "=" in arg or value.startswith("-") or not value else f"{arg} {value}"
            return with_suggestion(f"unrecognized arguments: {shown}", known)
    for path in config_files([subcommand, *args]):
        try:
            import yaml

            config = yaml.safe_load(Path(path).read_text())
        except (OSError, ValueError, ImportError, yaml.YAMLError):
            return None  # the parser says what is wrong with the file
        key = _unknown_yaml_key(config, schema) if isinstance(config, dict) else None
        if key is not None:
            return with_suggestion(f"Subcommand '{subcommand}' does not accept option '{key}'", known)
    return None


def answer_from_cache(args: Sequence[str]) -> int | None:
    """Answer ``args`` from the cached schema when it can: a bare ``SUBCOMMAND --help`` prints the help (exit 0), an
    unknown key prints the parser's one-line error (exit 2); ``None`` leaves everything else to the parser."""
    if not args:
        return None
    schema = cached_schema()
    entry = (schema or {}).get("subcommands", {}).get(args[0])
    if entry is None:
        return None
    rest = list(args[1:])
    if len(rest) == 1 and rest[0] in _HELP_FLAGS:
        print(entry["help"], end="")
        return EXIT_OK
    if any(arg in _HELP_FLAGS or arg.partition("=")[0].endswith(".help") for arg in rest):
        return None  # help is printed before any key is checked
    message = unknown_key(args[0], rest, entry)
    if message is None:
        return None
    print(f"lightning-fl: error: {message}", file=sys.stderr)
    return EXIT_BAD_CONFIG
