"""Objects from configuration data: ``{class_path, init_args}`` mappings, as every lightning-fl YAML writes them.

A fit config's parts are built by the fit command's parser (:mod:`lightning_fl.cli_fit`); what is not part of one
(the bench's attacks, the benchmark scripts' own parts) is built by :func:`build`, which hands each entry to
jsonargparse too, so every ``class_path`` of every config is checked and made the same way.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["build", "load_class"]


def load_class(class_path: str) -> type:
    """The class named by a dotted ``class_path``.

    Raises:
        ValueError: naming the class path when its module or class does not exist.

    Example:
        >>> load_class("collections.OrderedDict")
        <class 'collections.OrderedDict'>
    """
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(
            f"class_path {class_path!r} cannot be imported ({type(err).__name__}); fix the path."
        ) from None


def build(value: Any) -> Any:
    """Instantiate ``class_path``/``init_args`` mappings, recursively (lists and nested arguments too); anything
    else is returned as it is.

    Each entry is built as the command's parser builds it: jsonargparse checks ``init_args`` against the class's
    signature and makes the object (:func:`_instantiate`); nested entries are built first, by this function.

    Raises:
        ValueError: one line naming the class path and the key when a class path does not import or the class
            refuses its ``init_args``.

    Example:
        >>> build([{"class_path": "fractions.Fraction", "init_args": {"numerator": 3, "denominator": 6}}, 2])
        [Fraction(1, 2), 2]
    """
    if isinstance(value, list):
        return [build(v) for v in value]
    if isinstance(value, Mapping) and "class_path" in value:
        init_args = {k: build(v) for k, v in (value.get("init_args") or {}).items()}
        return _instantiate(value["class_path"], init_args)
    if isinstance(value, Mapping):
        return {k: build(v) for k, v in value.items()}
    return value


def _instantiate(class_path: str, init_args: Mapping[str, Any]) -> Any:
    """``class_path(**init_args)`` made by jsonargparse, the builder of every ``lightning-fl`` config."""
    from jsonargparse import ArgumentError

    from lightning_fl.cli_errors import one_line

    parser = _entry_parser(class_path)
    try:
        return parser.instantiate(
            parser.parse_object({"entry": {"class_path": class_path, "init_args": init_args}})
        ).entry
    except ArgumentError as err:
        raise ValueError(f"class_path {class_path!r}: {one_line(err).removeprefix('entry.')}") from None


@functools.cache
def _entry_parser(class_path: str) -> Any:
    """The parser of one ``class_path`` entry, built once per class (it holds no state between parses)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--entry", type=load_class(class_path))
    return parser
