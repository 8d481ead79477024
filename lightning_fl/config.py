"""Objects from configuration data: ``{class_path, init_args}`` mappings, as every lightning-fl YAML writes them.

The command line builds its objects with jsonargparse; what reads a YAML without it (the bench grid, its worker
processes, the benchmark scripts) builds them with :func:`build`, the one builder outside it.
"""

from __future__ import annotations

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

    Example:
        >>> build([{"class_path": "fractions.Fraction", "init_args": {"numerator": 3, "denominator": 6}}, 2])
        [Fraction(1, 2), 2]
    """
    if isinstance(value, list):
        return [build(v) for v in value]
    if isinstance(value, Mapping) and "class_path" in value:
        return load_class(value["class_path"])(**{k: build(v) for k, v in (value.get("init_args") or {}).items()})
    if isinstance(value, Mapping):
        return {k: build(v) for k, v in value.items()}
    return value
