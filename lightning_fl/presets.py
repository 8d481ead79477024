"""Presets: a class that is a paper's settings of a more general one, declared as data instead of a constructor.

DLG, iDLG and Inverting Gradients are one gradient-matching engine with different settings, as FedAdagrad, FedAdam
and FedYogi are one server optimiser (Reddi et al., ICLR 2021, Alg. 2) with different defaults. A preset class
states what its paper fixes and what a user may change, with the paper's values; :meth:`Preset.constructor` turns
that into the class's ``__init__``, one generic constructor that merges the paper's values and the user's. Its
signature is a real one (keyword-only, typed, with defaults), so ``inspect.signature``, ``help()`` and
jsonargparse (``class_path``/``init_args`` in YAML, ``--help``) see each preset's own arguments.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["REQUIRED", "Preset"]

REQUIRED: Any = inspect.Parameter.empty
"""The default of a preset argument that has none: the user must give it."""

_NOTHING: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Preset:
    """A paper's settings of a general constructor (the *engine*): what the paper fixes and what a user may change.

    Args:
        pinned: engine arguments the paper fixes (DLG's Euclidean distance, iDLG's inferred labels); they are not
            arguments of the preset.
        defaults: the preset's keyword arguments, in order, each with the paper's value (:data:`REQUIRED` where
            the user must give one).

    Raises:
        ValueError: when a name is both pinned and an argument.

    Example:
        >>> class Engine:
        ...     def __init__(self, *, a: int = 0, b: str = "x") -> None:
        ...         self.a, self.b = a, b
        >>> class Paper(Engine):
        ...     pass
        >>> Paper.__init__ = Preset(pinned={"b": "y"}, defaults={"a": 3}).constructor(Engine.__init__, owner=Paper)
        >>> vars(Paper()), vars(Paper(a=4)), inspect.signature(Paper)
        ({'a': 3, 'b': 'y'}, {'a': 4, 'b': 'y'}, <Signature (*, a: int = 3) -> None>)
        >>> Paper(b="z")
        Traceback (most recent call last):
        ...
        TypeError: Paper(): got an unexpected keyword argument 'b'
    """

    pinned: Mapping[str, Any] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # read-only copies: a class's paper settings cannot be changed through it
        object.__setattr__(self, "pinned", MappingProxyType(dict(self.pinned)))
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))
        both = sorted(set(self.pinned) & set(self.defaults))
        if both:
            raise ValueError(f"Preset: {both} are both pinned and arguments; a paper fixes a setting or offers it.")

    def derive(self, *, pinned: Mapping[str, Any] = _NOTHING, defaults: Mapping[str, Any] = _NOTHING) -> Preset:
        """This preset with more settings ``pinned`` (they stop being arguments) and ``defaults`` added (first) or
        changed (in place).

        Example:
            >>> Preset(defaults={"a": 1, "b": 2, "c": 3}).derive(pinned={"a": 0}, defaults={"c": 4, "d": 5})
            Preset(pinned={'a': 0}, defaults={'d': 5, 'b': 2, 'c': 4})
        """
        kept = {name: defaults.get(name, value) for name, value in self.defaults.items() if name not in pinned}
        added = {name: value for name, value in defaults.items() if name not in kept}
        return Preset(pinned={**self.pinned, **pinned}, defaults={**added, **kept})

    def __repr__(self) -> str:
        return f"Preset(pinned={dict(self.pinned)}, defaults={dict(self.defaults)})"

    def signature(self, types: Mapping[str, Any]) -> inspect.Signature:
        """The preset's ``__init__(self, *, ...)`` signature, each argument typed by ``types``.

        Raises:
            TypeError: naming an argument that ``types`` does not type.
        """
        untyped = [name for name in self.defaults if name not in types]
        if untyped:
            raise TypeError(f"Preset arguments {untyped} have no type; annotate them where the engine takes them.")
        own = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
        own += [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=types[name])
            for name, default in self.defaults.items()
        ]
        return inspect.Signature(own, return_annotation=None)

    def constructor(
        self, engine: Callable[..., None], *, owner: type, types: Mapping[str, Any] | None = None
    ) -> Callable[..., None]:
        """The ``__init__`` of the preset class ``owner``: it takes the preset's arguments and calls
        ``engine(self, **pinned, **arguments)`` with the user's values over the paper's.

        Args:
            engine: the general constructor, ``(self, **settings) -> None``.
            owner: the preset class (it names the function).
            types: each argument's type; ``None``: the annotations of ``engine``.

        Raises:
            TypeError: at construction, on an unknown or missing argument, naming it.
        """
        signature = self.signature(types if types is not None else inspect.get_annotations(engine, eval_str=True))
        pinned = dict(self.pinned)

        def __init__(instance: Any, /, **arguments: Any) -> None:
            try:
                bound = signature.bind(instance, **arguments)
            except TypeError as error:
                raise TypeError(f"{type(instance).__name__}(): {error}") from None
            bound.apply_defaults()
            given = {name: value for name, value in bound.arguments.items() if name != "self"}
            engine(instance, **pinned, **given)

        __init__.__signature__ = signature  # type: ignore[attr-defined]
        __init__.__annotations__ = {p.name: p.annotation for p in list(signature.parameters.values())[1:]}
        __init__.__annotations__["return"] = None
        __init__.__qualname__, __init__.__module__ = f"{owner.__qualname__}.__init__", owner.__module__
        return __init__
