"""The benchmark grid: settings from a YAML config, the ``--quick`` preset, utility runs and attack cells.

Two kinds of run make a bench. A *utility run* trains one defence (and seed) at the config's own ``data``,
``model`` and ``loop`` settings, exactly as ``lightning-fl fit`` would: it gives the test accuracy and ε that every
attack row of that defence reports. An *attack cell* is one attack against one defence under one *threat model*
(what the attacker intercepts: leak point, batch size, local steps, an untrained or the utility run's trained
model), with one seed; its run is short (``attack_run``) and only its reconstruction scores count. The settings are
plain data (``class_path``/``init_args`` mappings, as in every lightning-fl config), so a run can be sent to a
worker process and built there.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "SELECTABLE",
    "Cell",
    "Utility",
    "applies",
    "build",
    "cells",
    "fixed_batches",
    "load_class",
    "load_settings",
    "select",
    "utilities",
]

_REQUIRED = ("data", "model", "loop", "defences", "attacks", "threat_models", "seeds")
_THREAT_MODEL_KEYS = {"leak_point", "trained", "max_images", "attack_rounds", "data", "model", "loop", "about"}
SELECTABLE = ("defences", "attacks", "threat_models", "seeds")
"""Grid axes a command line (``--defences a,b``) or an ``only:`` section may trim."""


def _merge(base: Any, override: Any) -> Any:
    """Mappings merge key by key; anything else (lists included) is replaced."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(override)


def select(settings: Mapping[str, Any], axis: str, keep: Sequence[Any]) -> dict[str, Any]:
    """``settings`` with the grid axis ``axis`` (one of :data:`SELECTABLE`) trimmed to ``keep``, in that order.

    Raises:
        ValueError: naming the values of ``keep`` that the config does not have.

    Example:
        >>> select({"seeds": [0, 1, 2]}, "seeds", [2])["seeds"]
        [2]
    """
    known = settings[axis]
    unknown = [k for k in keep if k not in known]
    if unknown or not keep:
        raise ValueError(
            f"--{axis} {','.join(map(str, keep))}: {unknown or 'nothing'} not in the config's {axis}: {list(known)}."
        )
    chosen = list(keep) if axis == "seeds" else {name: known[name] for name in keep}
    return {**settings, axis: chosen}


def load_settings(path: str | Path, *, quick: bool = False) -> dict[str, Any]:
    """Read a bench config; with ``quick``, merge its ``quick:`` section over it (lists are replaced).

    Raises:
        ValueError: naming the missing key, an empty or unknown name in ``only``, or a malformed threat model.
    """
    raw = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"bench config {path} is not a mapping; see configs/bench_digits.yaml for the keys.")
    missing = [key for key in _REQUIRED if key not in raw]
    if missing:
        raise ValueError(f"bench config {path} lacks {missing}; see configs/bench_digits.yaml for the keys.")
    preset = raw.pop("quick", {}) or {}
    settings = _merge(raw, preset) if quick else raw
    for axis in SELECTABLE:
        if not settings[axis]:
            raise ValueError(f"bench config {path}: {axis} is empty; name at least one.")
        keep = (settings.get("only") or {}).get(axis)
        if keep is not None:
            settings = select(settings, axis, keep)
    for name, threat in settings["threat_models"].items():
        unknown = sorted(set(threat or {}) - _THREAT_MODEL_KEYS)
        if unknown or not (threat or {}).get("leak_point"):
            raise ValueError(
                f"threat_models.{name}: {'unknown keys ' + str(unknown) if unknown else 'no leak_point'}; a threat "
                f"model has leak_point and optionally {sorted(_THREAT_MODEL_KEYS - {'leak_point'})}."
            )
    for name, attack in settings["attacks"].items():
        unknown = sorted(set(attack.get("applies_to") or []) - set(raw["defences"]))
        if unknown:
            raise ValueError(f"attacks.{name}.applies_to names {unknown}, not in defences: {sorted(raw['defences'])}.")
    return settings


def _defence(settings: Mapping[str, Any], defence: str) -> dict[str, Any]:
    if defence not in settings["defences"]:
        raise ValueError(f"defence {defence!r} is not in the config's defences: {sorted(settings['defences'])}.")
    return settings["defences"][defence] or {}


FIXED_BATCHES = "shuffled_batches"
"""The ``sampling`` an attack run gives every defence that samples its own batches (DP-SGD's Poisson batches)."""


def fixed_batches(defences: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``defences`` for an attack run: each one that takes a ``sampling`` option draws fixed batches of B.

    A threat model names the batch the attacker sees ("the mean gradient of B images"); under Poisson sampling
    (what a DP-SGD accountant assumes) a step holds B images only on average, so the attacked step would not be
    that threat model's. The utility run keeps the defence's own sampling, and with it the ε it reports.

    Example:
        >>> fixed_batches([{"class_path": "lightning_fl.defences.FedCDP"}])[0]["init_args"]
        {'sampling': 'shuffled_batches'}
    """
    return [
        {**entry, "init_args": {**(entry.get("init_args") or {}), "sampling": FIXED_BATCHES}}
        if "sampling" in inspect.signature(load_class(entry["class_path"])).parameters
        else dict(entry)
        for entry in defences
    ]


@dataclass(frozen=True)
class Utility:
    """One utility run: a defence trained at the config's ``data``/``model``/``loop`` settings, with one seed."""

    defence: str
    seed: int

    @property
    def key(self) -> str:
        """The run's file name stem: ``<defence>__s<seed>``."""
        return f"{self.defence}__s{self.seed}"

    def spec(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Everything that defines the run (what its fingerprint hashes): a ``lightning-fl fit`` config's parts."""
        defence = _defence(settings, self.defence)
        return {
            "run": f"utility/{self.key}",
            "data": settings["data"],
            "model": _merge(settings["model"], defence.get("model", {})),
            "loop": _merge(settings["loop"], defence.get("loop", {})),
            "defences": defence.get("defences", []),
            "client_callbacks": defence.get("client_callbacks", []),
            "seed": self.seed,
        }


@dataclass(frozen=True)
class Cell:
    """One attack cell: an attack against a defence under a threat model, with one seed."""

    defence: str
    attack: str
    threat_model: str
    seed: int

    @property
    def key(self) -> str:
        """The cell's file name stem: ``<defence>__<attack>__<threat_model>__s<seed>``."""
        return f"{self.defence}__{self.attack}__{self.threat_model}__s{self.seed}"

    @property
    def utility(self) -> Utility:
        """The utility run whose accuracy and ε this cell reports (and whose model ``trained`` attacks)."""
        return Utility(self.defence, self.seed)

    def spec(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Everything that defines this cell's attack run (what its fingerprint hashes).

        The run's settings are the config's ``data``/``model``/``loop``, the defence's ``model``, then
        ``attack_run``, then the defence's ``loop`` and then the threat model's ``data``/``model``/``loop``, each
        merged over the one before; the defences draw fixed batches (:func:`fixed_batches`).
        """
        defence = _defence(settings, self.defence)
        if self.threat_model not in settings["threat_models"]:
            raise ValueError(f"threat model {self.threat_model!r} is not in {sorted(settings['threat_models'])}.")
        if self.attack not in settings["attacks"]:
            raise ValueError(f"attack {self.attack!r} is not in the config's attacks: {sorted(settings['attacks'])}.")
        threat = settings["threat_models"][self.threat_model]
        run = settings.get("attack_run") or {}
        parts = {k: _merge(settings[k], run.get(k, {})) for k in ("data", "loop")}
        parts["model"] = _merge(_merge(settings["model"], defence.get("model", {})), run.get("model", {}))
        parts["loop"] = _merge(parts["loop"], defence.get("loop", {}))
        parts = {k: _merge(v, threat.get(k, {})) for k, v in parts.items()}
        trained = bool(threat.get("trained", False))
        return {
            "cell": self.key,
            **parts,
            "defences": fixed_batches(defence.get("defences", [])),
            "client_callbacks": defence.get("client_callbacks", []),
            "attack": {k: v for k, v in settings["attacks"][self.attack].items() if k != "applies_to"},
            "threat_model": self.threat_model,
            "leak_point": threat["leak_point"],
            "trained_from": fingerprint(self.utility.spec(settings)) if trained else None,
            "attack_rounds": threat.get("attack_rounds", settings.get("attack_rounds", [0])),
            "max_images": threat.get("max_images", settings.get("max_images", 1)),
            "success_ssim": settings.get("success_ssim", 0.5),
            "seed": self.seed,
        }


def applies(settings: Mapping[str, Any], attack: str, defence: str) -> bool:
    """Whether ``attack`` runs against ``defence``: always, unless the attack names the defences it applies to
    (``applies_to``: model inversion needs a model with private layers)."""
    allowed = settings["attacks"][attack].get("applies_to")
    return allowed is None or defence in allowed


def utilities(settings: Mapping[str, Any]) -> list[Utility]:
    """One utility run per defence and seed, seed by seed."""
    return [Utility(defence, int(seed)) for seed in settings["seeds"] for defence in settings["defences"]]


def cells(settings: Mapping[str, Any]) -> list[Cell]:
    """The attack grid: defences × attacks × threat models × seeds, in that nesting order, where the attack
    applies."""
    return [
        Cell(defence, attack, threat_model, int(seed))
        for defence in settings["defences"]
        for attack in settings["attacks"]
        if applies(settings, attack, defence)
        for threat_model in settings["threat_models"]
        for seed in settings["seeds"]
    ]


def fingerprint(spec: Mapping[str, Any]) -> str:
    """A short hash of a run's spec: a finished run is re-run only when its settings changed."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_class(class_path: str) -> type:
    """The class named by a dotted ``class_path``.

    Raises:
        ValueError: naming the class path when its module or class does not exist.
    """
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(
            f"class_path {class_path!r} cannot be imported ({type(err).__name__}); fix the path."
        ) from None


def build(value: Any) -> Any:
    """Instantiate ``class_path``/``init_args`` mappings, recursively (lists and nested arguments too)."""
    if isinstance(value, list):
        return [build(v) for v in value]
    if isinstance(value, Mapping) and "class_path" in value:
        return load_class(value["class_path"])(**{k: build(v) for k, v in (value.get("init_args") or {}).items()})
    if isinstance(value, Mapping):
        return {k: build(v) for k, v in value.items()}
    return value
