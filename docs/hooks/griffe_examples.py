"""A griffe extension for the docs site: the package's docstrings title their doctests ``Example:`` (one example),
which griffe's Google parser reads as prose; it reads them as an ``Examples:`` section, so they render as code."""

from __future__ import annotations

import ast
import inspect
import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:$", flags=re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename each docstring's ``Example:`` section to ``Examples:`` before it is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)


class AssignedDocstrings(griffe.Extension):
    """Give a class whose body sets ``__doc__ = NAME`` (``FederatedLoop``: its settings' meaning lives in
    ``loop_settings.py``) the docstring that ``NAME`` holds, which static analysis does not read."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for cls in _classes(pkg):
            assigned = cls.members.get("__doc__")
            if cls.docstring is not None or not isinstance(assigned, griffe.Attribute) or assigned.value is None:
                continue
            try:  # a name bound to a string literal; anything else keeps the class undocumented, as before
                target = pkg.modules_collection.get_member(assigned.value.canonical_path)
                text = ast.literal_eval(str(target.value))
            except (AttributeError, KeyError, ValueError, SyntaxError):
                continue
            cls.docstring = griffe.Docstring(inspect.cleandoc(text), parent=cls)


def _classes(module: griffe.Module) -> list[griffe.Class]:
    found = []
    for member in module.members.values():
        if member.is_alias:
            continue
        if member.is_module:
            found += _classes(member)
        elif member.is_class:
            found.append(member)
    return found
