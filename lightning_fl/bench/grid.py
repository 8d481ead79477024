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
    "apply_only",
    "build",
    "cells",
    "changes_run",
    "fixed_batches",
    "load_class",
    "load_settings",
    "read_mapping",
    "select",
    "server_threat",
    "utilities",
]

_REQUIRED = ("data", "model", "loop", "defences", "attacks", "threat_models", "seeds")
_THREAT_MODEL_KEYS = {"leak_point", "trained", "max_images", "attack_rounds", "data", "model", "loop", "about"}
_ATTACK_KEYS = {"class_path", "init_args", "applies_to", "server_plugins", "model"}
"""An attack entry: the attack, the defences it runs against, and what it changes of its own run: what a
malicious server changes of the model it ships (``server_plugins``, applied before the defence's bundles) and the model
(``model``, merged over the attack run's); an attack with either gets an attack run of its own."""
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


def apply_only(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` trimmed to its ``only:`` section (see :func:`select`), which it no longer holds once applied.

    Raises:
        ValueError: naming an ``only`` value that the config does not have.

    Example:
        >>> apply_only({"seeds": [0, 1, 2], "only": {"seeds": [1]}})
        {'seeds': [1]}
    """
    only = settings.get("only") or {}
    settings = {key: value for key, value in settings.items() if key != "only"}
    for axis in SELECTABLE:
        if only.get(axis) is not None:
            settings = select(settings, axis, only[axis])
    return settings


def read_mapping(path: str | Path, what: str) -> dict[str, Any]:
    """The YAML mapping in ``path`` (a ``what``: "bench config", "fit config", ...).

    Raises:
        ValueError: naming the file when it is missing or does not hold a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such {what}; give a YAML file from configs/.")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: a {what} holds a mapping of settings, not {type(raw).__name__}; see configs/.")
    return dict(raw)


def _read(path: Path, *, quick: bool, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The settings of ``path``: its ``base:`` config's (a path relative to ``path``'s folder), then its own keys,
    then, with ``quick``, its ``quick:`` section, each merged over the one before."""
    raw = read_mapping(path, "bench config")
    preset = raw.pop("quick", {}) or {}
    base = raw.pop("base", None)
    if base is not None:
        base_path = (path.parent / str(base)).resolve()
        if base_path in seen or base_path == path.resolve():
            raise ValueError(f"bench config {path}: base: {base} leads back to itself; name a config without a cycle.")
        raw = _merge(_read(base_path, quick=quick, seen=(*seen, path.resolve())), raw)
    return _merge(raw, preset) if quick else raw


def load_settings(path: str | Path, *, quick: bool = False) -> dict[str, Any]:
    """Read a bench config; with ``quick``, merge its ``quick:`` section over it (lists are replaced).

    A config may start from another: ``base: bench_photos.yaml`` (relative to its own folder) takes that config's
    settings (its ``quick:`` section included), and the keys given here override them as ``quick:`` does.

    Raises:
        ValueError: naming the missing key, an empty or unknown name in ``only``, or a malformed threat model.
    """
    raw = _read(Path(path), quick=quick)
    missing = [key for key in _REQUIRED if key not in raw]
    if missing:
        raise ValueError(f"bench config {path} lacks {missing}; see configs/bench_digits.yaml for the keys.")
    for axis in SELECTABLE:
        if not raw[axis]:
            raise ValueError(f"bench config {path}: {axis} is empty; name at least one.")
    settings = apply_only(raw)
    for name, threat in settings["threat_models"].items():
        unknown = sorted(set(threat or {}) - _THREAT_MODEL_KEYS)
        if unknown or not (threat or {}).get("leak_point"):
            raise ValueError(
                f"threat_models.{name}: {'unknown keys ' + str(unknown) if unknown else 'no leak_point'}; a threat "
                f"model has leak_point and optionally {sorted(_THREAT_MODEL_KEYS - {'leak_point'})}."
            )
    for name, attack in settings["attacks"].items():
        keys = sorted(set(attack) - _ATTACK_KEYS)
        if keys:
            raise ValueError(f"attacks.{name}: unknown keys {keys}; an attack has {sorted(_ATTACK_KEYS)}.")
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
        ``attack_run``, then the defence's ``loop``, then the threat model's ``data``/``model``/``loop`` and then the
        attack's own ``model``, each merged over the one before; the attack's ``server_plugins`` apply before the
        defence's bundles (the malicious server changes the model first, the clients' defences act on what it
        ships), and the defences draw fixed batches (:func:`fixed_batches`). ``run`` names the attack run: shared
        by the cells of one defence, threat model and seed, unless the attack changes the run.
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
        attack = settings["attacks"][self.attack]
        parts["model"] = _merge(parts["model"], attack.get("model", {}))
        trained = bool(threat.get("trained", False))
        run = f"{self.defence}__{self.threat_model}__s{self.seed}"
        return {
            "cell": self.key,
            "run": f"{run}__{self.attack}" if changes_run(attack) else run,
            **parts,
            "defences": fixed_batches(defence.get("defences", [])),
            **({"server_plugins": attack["server_plugins"]} if attack.get("server_plugins") else {}),
            "client_callbacks": defence.get("client_callbacks", []),
            "attack": {k: attack[k] for k in ("class_path", "init_args") if k in attack},
            "server": server_threat(attack),
            "threat_model": self.threat_model,
            "leak_point": threat["leak_point"],
            "trained_from": fingerprint(self.utility.spec(settings)) if trained else None,
            "attack_rounds": threat.get("attack_rounds", settings.get("attack_rounds", [0])),
            "max_images": threat.get("max_images", settings.get("max_images", 1)),
            "success_ssim": settings.get("success_ssim", 0.5),
            "seed": self.seed,
        }


def changes_run(attack: Mapping[str, Any]) -> bool:
    """Whether an attack entry changes its attack run (``server_plugins`` or ``model``): it then gets its own."""
    return bool(attack.get("server_plugins") or attack.get("model"))


def server_threat(attack: Mapping[str, Any]) -> str:
    """The server an attack entry assumes: ``malicious`` when it changes the model the clients receive
    (``server_plugins``, e.g. Robbing the Fed's imprint), else ``honest-but-curious`` (it only reads).

    Example:
        >>> server_threat({"class_path": "x.DLGAttack"}), server_threat({"server_plugins": [{"class_path": "x.M"}]})
        ('honest-but-curious', 'malicious')
    """
    return "malicious" if attack.get("server_plugins") else "honest-but-curious"


def applies(settings: Mapping[str, Any], attack: str, defence: str, threat_model: str | None = None) -> bool:
    """Whether ``attack`` runs against ``defence`` (under ``threat_model``): always, unless the attack names the
    defences it applies to (``applies_to``: model inversion needs a model with private layers), or it changes its
    run's model and the threat model attacks the utility run's trained one (that model has no such layers)."""
    entry = settings["attacks"][attack]
    allowed = entry.get("applies_to")
    trained = threat_model is not None and bool((settings["threat_models"][threat_model] or {}).get("trained"))
    return (allowed is None or defence in allowed) and not (trained and changes_run(entry))


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
        for threat_model in settings["threat_models"]
        if applies(settings, attack, defence, threat_model)
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
