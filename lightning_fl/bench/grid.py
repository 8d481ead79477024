"""The benchmark grid: settings from a YAML config, the ``--quick`` preset, and one :class:`Cell` per run.

A cell is one federated run: one defence bundle, one attack at one leak point, one seed, on the same data and
model as every other cell. The settings are plain data (``class_path``/``init_args`` mappings, as in every
lightning-fl config), so a cell can be sent to a worker process and built there.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Cell", "applies", "build", "cells", "load_class", "load_settings"]

_REQUIRED = ("data", "model", "loop", "defences", "attacks", "leak_points", "seeds")


def _merge(base: Any, override: Any) -> Any:
    """Mappings merge key by key; anything else (lists included) is replaced."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(override)


def load_settings(path: str | Path, *, quick: bool = False) -> dict[str, Any]:
    """Read a bench config; with ``quick``, merge its ``quick:`` section over it (lists are replaced).

    Raises:
        ValueError: naming the missing key or the unknown name in ``only``.
    """
    raw = yaml.safe_load(Path(path).read_text()) or {}
    missing = [key for key in _REQUIRED if key not in raw]
    if missing:
        raise ValueError(f"bench config {path} lacks {missing}; see configs/bench_digits.yaml for the keys.")
    preset = raw.pop("quick", {}) or {}
    settings = _merge(raw, preset) if quick else raw
    for kind in ("defences", "attacks"):
        keep = settings.get("only", {}).get(kind)
        if keep is not None:
            unknown = sorted(set(keep) - set(settings[kind]))
            if unknown:
                raise ValueError(f"only.{kind} names {unknown}, not in {kind}: {sorted(settings[kind])}.")
            settings[kind] = {name: settings[kind][name] for name in keep}
    for name, attack in settings["attacks"].items():
        known = set(raw["defences"]) | set((preset.get("defences") or {}) if quick else {})
        unknown = sorted(set(attack.get("applies_to") or []) - known)
        if unknown:
            raise ValueError(f"attacks.{name}.applies_to names {unknown}, not in defences: {sorted(known)}.")
    return settings


@dataclass(frozen=True)
class Cell:
    """One benchmark run: a defence, an attack at a leak point, a seed."""

    defence: str
    attack: str
    leak_point: str
    seed: int

    @property
    def key(self) -> str:
        """The cell's file name stem: ``<defence>__<attack>__<leak_point>__s<seed>``."""
        return f"{self.defence}__{self.attack}__{self.leak_point}__s{self.seed}"

    def spec(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Everything that defines this cell's run (what its fingerprint hashes)."""
        defence = settings["defences"][self.defence] or {}
        loop = _merge(settings["loop"], defence.get("loop", {}))
        loop = _merge(loop, settings.get("leak_point_loop", {}).get(self.leak_point, {}))
        return {
            "cell": self.key,
            "data": settings["data"],
            "model": settings["model"],
            "loop": loop,
            "defences": defence.get("defences", []),
            "client_callbacks": defence.get("client_callbacks", []),
            "attack": {k: v for k, v in settings["attacks"][self.attack].items() if k != "applies_to"},
            "leak_point": self.leak_point,
            "attack_rounds": settings.get("attack_rounds", [0]),
            "max_images": settings.get("max_images", 1),
            "success_ssim": settings.get("success_ssim", 0.5),
            "seed": self.seed,
        }


def applies(settings: Mapping[str, Any], attack: str, defence: str) -> bool:
    """Whether ``attack`` runs against ``defence``: always, unless the attack names the defences it applies to
    (``applies_to``: model inversion needs a model with private layers)."""
    allowed = settings["attacks"][attack].get("applies_to")
    return allowed is None or defence in allowed


def cells(settings: Mapping[str, Any]) -> list[Cell]:
    """The grid: defences × attacks × leak points × seeds, in that nesting order, where the attack applies."""
    return [
        Cell(defence, attack, leak_point, int(seed))
        for defence in settings["defences"]
        for attack in settings["attacks"]
        if applies(settings, attack, defence)
        for leak_point in settings["leak_points"]
        for seed in settings["seeds"]
    ]


def fingerprint(spec: Mapping[str, Any]) -> str:
    """A short hash of a cell's spec: a finished cell is re-run only when its settings changed."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_class(class_path: str) -> type:
    """The class named by a dotted ``class_path``."""
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def build(value: Any) -> Any:
    """Instantiate ``class_path``/``init_args`` mappings, recursively (lists and nested arguments too)."""
    if isinstance(value, list):
        return [build(v) for v in value]
    if isinstance(value, Mapping) and "class_path" in value:
        return load_class(value["class_path"])(**{k: build(v) for k, v in (value.get("init_args") or {}).items()})
    if isinstance(value, Mapping):
        return {k: build(v) for k, v in value.items()}
    return value
