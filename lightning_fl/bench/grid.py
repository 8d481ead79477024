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
import inspect
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lightning_fl.config import load_class

__all__ = [
    "SELECTABLE",
    "Cell",
    "Utility",
    "applies",
    "apply_only",
    "attack_at_strength",
    "cells",
    "changes_run",
    "expand_strengths",
    "family",
    "fixed_batches",
    "load_settings",
    "merge",
    "merged_model",
    "model_layers",
    "read_mapping",
    "select",
    "server_threat",
    "set_path",
    "utilities",
    "utility_rounds",
]

_STRENGTH_KEYS = {"key", "values"}
"""A defence's strength axis: ``key``, a dotted path into its entry (``defences.0.init_args.ratio``; a path
starting ``init_args.`` is short for ``defences.0.init_args.``), and the ``values`` it takes, one defence each."""
_REQUIRED = ("data", "model", "loop", "defences", "attacks", "threat_models", "seeds")
_THREAT_MODEL_KEYS = {
    "leak_point",
    "trained",
    "protocol",
    "clients",
    "attacks",
    "max_images",
    "attack_rounds",
    "data",
    "model",
    "loop",
    "about",
}
"""A threat model: its ``leak_point``; ``protocol``: ``attack`` (default: a short attack run, ``attack_run``) or
``utility`` (the utility run itself, retrained with the attacks at ``attack_rounds``, by default its first,
middle and last round: leakage over training, :func:`utility_rounds`); ``trained`` (start from the utility run's
model); ``clients`` (the client ids attacked, default every selected one); ``attacks`` (the attacks that run under
it, default all); ``max_images``, ``attack_rounds``, and ``data``/``model``/``loop`` merged over the run's."""
PROTOCOLS = ("attack", "utility")
_ATTACK_KEYS = {"class_path", "init_args", "applies_to", "strength_arg", "server_plugins", "model"}
"""An attack entry: the attack, the defences it runs against, and what it changes of its own run: what a
malicious server changes of the model it ships (``server_plugins``, applied before the defence's bundles) and the
model
(``model``, merged over the attack run's); an attack with either gets an attack run of its own. ``strength_arg``
(with ``applies_to``): the ``init_args`` key that takes the defence's strength value in each cell, so an adaptive
attack models the defence at that strength (``ig_noise_aware``'s ``noise_scale`` follows ``noise_std``)."""
SELECTABLE = ("defences", "attacks", "threat_models", "seeds")
"""Grid axes a command line (``--defences a,b``) or an ``only:`` section may trim."""


def merge(base: Any, override: Any) -> Any:
    """Mappings merge key by key; anything else (lists included) is replaced, and so is a mapping whose
    ``class_path`` the override changes (the old class's ``init_args`` are not the new class's: a user's own model
    over a preset's ``ImageClassifier`` takes none of its ``backbone``, ``optimizer``...).

    Example:
        >>> merge({"loop": {"num_rounds": 25, "local_epochs": 3}}, {"loop": {"num_rounds": 5}})
        {'loop': {'num_rounds': 5, 'local_epochs': 3}}
        >>> merge({"class_path": "a.A", "init_args": {"backbone": "x"}}, {"class_path": "my.Net"})
        {'class_path': 'my.Net'}
    """
    if isinstance(base, Mapping) and isinstance(override, Mapping) and _same_class(base, override):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(override)


def _same_class(base: Mapping[str, Any], override: Mapping[str, Any]) -> bool:
    """Whether ``override`` keeps ``base``'s class: it names none, or the same ``class_path``."""
    return "class_path" not in override or override["class_path"] == base.get("class_path")


def select(settings: Mapping[str, Any], axis: str, keep: Sequence[Any]) -> dict[str, Any]:
    """``settings`` with the grid axis ``axis`` (one of :data:`SELECTABLE`) trimmed to ``keep``, in that order.

    Raises:
        ValueError: naming the values of ``keep`` that the config does not have.

    Example:
        >>> select({"seeds": [0, 1, 2]}, "seeds", [2])["seeds"]
        [2]
    """
    known = settings[axis]
    names = {k: [k] for k in known} if axis != "defences" else _by_family(known)
    unknown = [k for k in keep if k not in known and k not in names]
    if unknown or not keep:
        strengths = [k for k in known if k not in names]  # a swept defence's values, selectable one by one
        raise ValueError(
            f"--{axis} {','.join(map(str, keep))}: {unknown or 'nothing'} not in the config's {axis}: {list(names)}"
            + (f" or one strength: {strengths}." if strengths else ".")
        )
    if axis == "seeds":
        return {**settings, axis: list(keep)}
    chosen = [name for k in keep for name in (names.get(k) or [k])]  # a family keeps all its strengths
    return {**settings, axis: {name: known[name] for name in chosen}}


def _by_family(defences: Mapping[str, Any]) -> dict[str, list[str]]:
    """Defence names by family: a defence with a strength axis (expanded) is selected by its family's name too."""
    families: dict[str, list[str]] = {}
    for name, entry in defences.items():
        families.setdefault((entry or {}).get("family", name), []).append(name)
    return families


def apply_only(settings: Mapping[str, Any], *, chosen_elsewhere: Collection[str] = ()) -> dict[str, Any]:
    """``settings`` trimmed to its ``only:`` section (see :func:`select`), which it no longer holds once applied;
    the axes in ``chosen_elsewhere`` (those a command line selects) are left whole.

    Raises:
        ValueError: naming an ``only`` value that the config does not have.

    Example:
        >>> apply_only({"seeds": [0, 1, 2], "only": {"seeds": [1]}})
        {'seeds': [1]}
    """
    only = settings.get("only") or {}
    settings = {key: value for key, value in settings.items() if key != "only"}
    for axis in SELECTABLE:
        if only.get(axis) is not None and axis not in chosen_elsewhere:
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
        raw = _layer(_read(base_path, quick=quick, seen=(*seen, path.resolve())), raw)
    return _layer(raw, preset) if quick else raw


def _layer(settings: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` merged over ``settings``; an axis list it gives (``seeds: [1]``) replaces the ``only:`` selection
    of that axis it inherits, unless it gives that selection too.

    Example:
        >>> _layer({"seeds": [0, 1, 2], "only": {"seeds": [0]}}, {"seeds": [1]})
        {'seeds': [1], 'only': {}}
    """
    merged = merge(settings, override)
    given = override.get("only") or {}
    for axis in SELECTABLE:
        if axis in override and axis not in given and axis in (merged.get("only") or {}):
            merged["only"] = {key: value for key, value in merged["only"].items() if key != axis}
    return merged


def load_settings(path: str | Path, *, quick: bool = False, chosen_elsewhere: Collection[str] = ()) -> dict[str, Any]:
    """Read a bench config; with ``quick``, merge its ``quick:`` section over it (lists are replaced), then trim it
    to its ``only:`` section except on the axes in ``chosen_elsewhere`` (a command line's ``--threat_models`` picks
    from every threat model of the config, not only from those its preset runs by default).

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
    settings = apply_only(expand_strengths(raw), chosen_elsewhere=chosen_elsewhere)  # only: may name one strength
    for name, threat in settings["threat_models"].items():
        unknown = sorted(set(threat or {}) - _THREAT_MODEL_KEYS)
        protocol = (threat or {}).get("protocol", "attack")
        if protocol not in PROTOCOLS or (protocol == "utility" and threat.get("trained")):
            raise ValueError(
                f"threat_models.{name}.protocol={protocol!r}: use one of {list(PROTOCOLS)} (utility: the utility run "
                "itself, which trains from the start, so not with trained: true)."
            )
        unknown_attacks = sorted(set((threat or {}).get("attacks") or []) - set(settings["attacks"]))
        if unknown_attacks:
            raise ValueError(f"threat_models.{name}.attacks names {unknown_attacks}, not in attacks.")
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
        if attack.get("strength_arg") and not attack.get("applies_to"):
            raise ValueError(
                f"attacks.{name}.strength_arg needs applies_to: name the defences whose strength is in that argument's "
                "unit."
            )
        if unknown:
            raise ValueError(f"attacks.{name}.applies_to names {unknown}, not in defences: {sorted(raw['defences'])}.")
    return settings


def _strength_label(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def set_path(entry: dict[str, Any], path: str, value: Any, where: str) -> dict[str, Any]:
    """A copy of ``entry`` with ``value`` at the dotted ``path`` (list indices as numbers; missing mappings made;
    ``init_args.X`` is short for ``defences.0.init_args.X``).

    Example:
        >>> set_path({"defences": [{"init_args": {"ratio": 0.7}}]}, "init_args.ratio", 0.9, "strength")
        {'defences': [{'init_args': {'ratio': 0.9}}]}

    Raises:
        ValueError: naming ``where`` when the path runs through a missing list item or a non-container.
    """
    entry = copy.deepcopy(entry)
    parts = path.split(".")
    if parts[0] == "init_args":
        parts = ["defences", "0", *parts]
    node: Any = entry
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            if last:
                node[int(part)] = value
            node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            node = node.setdefault(part, {})
        else:
            raise ValueError(
                f"{where}.key {path!r}: {'.'.join(parts[: i + 1])} is not in the entry; name a path through its "
                "defences list (defences.0.init_args.ratio) or its model/loop settings."
            )
    return entry


def expand_strengths(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with every defence that has a ``strength`` axis replaced by one defence per strength value.

    The defence ``pruning: {defences: [...], strength: {key: init_args.ratio, values: [0.5, 0.9]}}`` becomes
    ``pruning@0.5`` and ``pruning@0.9``, each its entry with the value at ``key`` (:data:`_STRENGTH_KEYS`), its
    ``family`` (the name an attack's ``applies_to`` and the plots' curves use) and its ``strength`` (key, value).
    Each is a defence of the grid as any other: its own utility run and attack runs. Expanded settings are left
    as they are.

    Raises:
        ValueError: naming the defence whose ``strength`` is malformed.

    Example:
        >>> axis = {"key": "init_args.ratio", "values": [0.5, 0.9]}
        >>> entry = {"defences": [{"class_path": "P", "init_args": {"ratio": 0.7}}], "strength": axis}
        >>> grid = expand_strengths({"defences": {"p": entry}})["defences"]
        >>> list(grid), grid["p@0.9"]["defences"][0]["init_args"], grid["p@0.9"]["family"]
        (['p@0.5', 'p@0.9'], {'ratio': 0.9}, 'p')
    """
    defences: dict[str, Any] = {}
    for name, entry in settings["defences"].items():
        entry = entry or {}
        axis = entry.get("strength")
        if axis is None or "family" in entry:
            defences[name] = entry
            continue
        where = f"defences.{name}.strength"
        values = axis.get("values") if isinstance(axis, Mapping) else None
        keys = set(axis) if isinstance(axis, Mapping) else set()
        if keys != _STRENGTH_KEYS or not isinstance(values, list) or not values:
            raise ValueError(
                f"{where}: give {{key: <path in the entry, e.g. init_args.ratio>, values: [v1, v2, ...]}}, "
                f"not {axis!r}."
            )
        base = {k: v for k, v in entry.items() if k != "strength"}
        for value in values:
            variant = set_path(base, str(axis["key"]), value, where)
            variant.update(family=name, strength={"key": str(axis["key"]), "value": value})
            defences[f"{name}@{_strength_label(value)}"] = variant
    return {**settings, "defences": defences}


def family(settings: Mapping[str, Any], defence: str) -> str:
    """The defence a strength variant belongs to (``pruning`` for ``pruning@0.5``); a defence without an axis is its
    own family."""
    return (settings["defences"].get(defence) or {}).get("family", defence)


def _defence(settings: Mapping[str, Any], defence: str) -> dict[str, Any]:
    if defence not in settings["defences"]:
        raise ValueError(f"defence {defence!r} is not in the config's defences: {sorted(settings['defences'])}.")
    return settings["defences"][defence] or {}


def model_layers(
    settings: Mapping[str, Any], defence: str, threat_model: str | None = None, attack: str | None = None
) -> list[tuple[str, Mapping[str, Any]]]:
    """The ``model`` settings a run merges (:func:`merge`), in order, each with the config key that gives it: the
    config's, the defence's; for an attack run (``threat_model`` and ``attack`` given) then ``attack_run``'s
    (unless the threat model attacks the utility run), the threat model's and the attack's.

    Example:
        >>> settings = {"model": {"class_path": "my.Net"}, "defences": {"none": {}},
        ...             "attack_run": {"model": {"init_args": {"lr": 0.1}}}, "threat_models": {"b1": {}},
        ...             "attacks": {"ig": {}}}
        >>> [key for key, layer in model_layers(settings, "none", "b1", "ig") if layer]
        ['model', 'attack_run.model']
    """
    layers = [("model", settings["model"]), (f"defences.{defence}.model", _defence(settings, defence).get("model", {}))]
    if threat_model is None or attack is None:
        return layers
    threat = settings["threat_models"][threat_model]
    run = {} if threat.get("protocol") == "utility" else settings.get("attack_run") or {}
    return [
        *layers,
        ("attack_run.model", run.get("model", {})),
        (f"threat_models.{threat_model}.model", threat.get("model", {})),
        (f"attacks.{attack}.model", settings["attacks"][attack].get("model", {})),
    ]


def merged_model(layers: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The model settings of :func:`model_layers`, each merged over the one before."""
    model: dict[str, Any] = {}
    for _, layer in layers:
        model = merge(model, layer)
    return model


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
            "model": merged_model(model_layers(settings, self.defence)),
            "loop": merge(settings["loop"], defence.get("loop", {})),
            "defences": defence.get("defences", []),
            "client_callbacks": defence.get("client_callbacks", []),
            "seed": self.seed,
            **({"tune": defence["tune"]} if defence.get("tune") else {}),
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
        ships), and the defences draw fixed batches (:func:`fixed_batches`). A ``protocol: utility`` threat model
        skips ``attack_run`` and keeps the defences' own sampling: its run is the utility run, attacked at its
        ``attack_rounds`` (default :func:`utility_rounds`). ``run`` names the attack run: shared by the cells of one
        defence, threat model and seed, unless the attack changes the run.
        """
        defence = _defence(settings, self.defence)
        if self.threat_model not in settings["threat_models"]:
            raise ValueError(f"threat model {self.threat_model!r} is not in {sorted(settings['threat_models'])}.")
        if self.attack not in settings["attacks"]:
            raise ValueError(f"attack {self.attack!r} is not in the config's attacks: {sorted(settings['attacks'])}.")
        threat = settings["threat_models"][self.threat_model]
        utility = threat.get("protocol") == "utility"
        run = {} if utility else settings.get("attack_run") or {}
        loop = merge(merge(settings["loop"], run.get("loop", {})), defence.get("loop", {}))
        parts = {
            "data": merge(merge(settings["data"], run.get("data", {})), threat.get("data", {})),
            "loop": merge(loop, threat.get("loop", {})),
            "model": merged_model(model_layers(settings, self.defence, self.threat_model, self.attack)),
        }
        default_rounds = utility_rounds(parts["loop"]) if utility else settings.get("attack_rounds", [0])
        attack = settings["attacks"][self.attack]
        trained = bool(threat.get("trained", False))
        run = f"{self.defence}__{self.threat_model}__s{self.seed}"
        return {
            "cell": self.key,
            "run": f"{run}__{self.attack}" if changes_run(attack) else run,
            **parts,
            "defences": defence.get("defences", []) if utility else fixed_batches(defence.get("defences", [])),
            **({"server_plugins": attack["server_plugins"]} if attack.get("server_plugins") else {}),
            "client_callbacks": defence.get("client_callbacks", []),
            "attack": attack_at_strength(attack, defence),
            "server": server_threat(attack),
            "threat_model": self.threat_model,
            "leak_point": threat["leak_point"],
            "trained_from": fingerprint(self.utility.spec(settings)) if trained else None,
            "attack_rounds": threat.get("attack_rounds", default_rounds),
            "clients": threat.get("clients"),
            "max_images": threat.get("max_images", settings.get("max_images", 1)),
            "success_ssim": settings.get("success_ssim", 0.5),
            "seed": self.seed,
        }


def attack_at_strength(attack: Mapping[str, Any], defence: Mapping[str, Any]) -> dict[str, Any]:
    """An attack's ``class_path`` and ``init_args`` against ``defence``, its ``strength_arg`` set to the defence's
    strength value where the defence has one (an adaptive attack modelling the defence at that strength).

    Example:
        >>> attack = {"class_path": "A", "init_args": {"noise_scale": 0.01}, "strength_arg": "noise_scale"}
        >>> attack_at_strength(attack, {"strength": {"key": "init_args.noise_std", "value": 0.1}})["init_args"]
        {'noise_scale': 0.1}
    """
    chosen = {k: copy.deepcopy(attack[k]) for k in ("class_path", "init_args") if k in attack}
    if attack.get("strength_arg") and defence.get("strength"):
        chosen["init_args"] = {**chosen.get("init_args", {}), attack["strength_arg"]: defence["strength"]["value"]}
    return chosen


def changes_run(attack: Mapping[str, Any]) -> bool:
    """Whether an attack entry changes its attack run (``server_plugins`` or ``model``): it then gets its own."""
    return bool(attack.get("server_plugins") or attack.get("model"))


SERVERS = ("honest-but-curious", "malicious")
"""The two servers an attack may assume: one that only reads what it receives, one that changes the model it sends."""


def server_threat(attack: Mapping[str, Any]) -> str:
    """The server of :data:`SERVERS` an attack entry assumes: ``malicious`` when it changes the model the clients
    receive (``server_plugins``, e.g. Robbing the Fed's imprint), else ``honest-but-curious`` (it only reads).

    Example:
        >>> server_threat({"class_path": "x.DLGAttack"}), server_threat({"server_plugins": [{"class_path": "x.M"}]})
        ('honest-but-curious', 'malicious')
    """
    return SERVERS[1] if attack.get("server_plugins") else SERVERS[0]


def applies(settings: Mapping[str, Any], attack: str, defence: str, threat_model: str | None = None) -> bool:
    """Whether ``attack`` runs against ``defence`` (under ``threat_model``): always, unless the attack names the
    defences it applies to (``applies_to``: model inversion needs a model with private layers), the threat model
    names the attacks that run under it (``attacks``), or the attack changes its run's model and the threat model
    attacks the utility run's own model (``trained`` or ``protocol: utility``: that model has no such layers)."""
    entry = settings["attacks"][attack]
    allowed = entry.get("applies_to")
    threat = (settings["threat_models"][threat_model] or {}) if threat_model is not None else {}
    own_model = bool(threat.get("trained")) or threat.get("protocol") == "utility"
    named = allowed is None or defence in allowed or family(settings, defence) in allowed
    chosen = threat.get("attacks") is None or attack in threat["attacks"]
    return named and chosen and not (own_model and changes_run(entry))


def utility_rounds(loop: Mapping[str, Any]) -> list[int]:
    """The rounds a ``protocol: utility`` threat model attacks by default: the run's first, middle and last.

    Example:
        >>> utility_rounds({"num_rounds": 25}), utility_rounds({"num_rounds": 2})
        ([0, 12, 24], [0, 1])
    """
    last = int(loop.get("num_rounds", 1)) - 1
    return sorted({0, last // 2, last})


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
    """A short hash of a run's spec: a finished run whose settings changed is re-run."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]
