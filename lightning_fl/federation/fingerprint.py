"""The fingerprint of a federation: the settings a resumed run must share with the run it continues.

A checkpoint's manifest stores it; resume compares it key by key and refuses a run whose clients, partition,
seed, local work, client Trainer options, norm bounds, evaluation mode, model layers or plug-ins differ, naming
the keys (a changed ``num_rounds`` is allowed: it is how
a run is extended). A plug-in (defence, transform, callback, aggregator, selector) counts with its settings, not
only its class (:func:`plugin_settings`): a resumed run with another noise multiplier would spend another privacy
budget under the same history. The defences and plug-ins come first, so a refusal names the privacy settings
before the run's shape. Digests stand in for what is too long to store (partition indices, layer shapes, tensors)
and for secrets (keys), which never enter the manifest in clear.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    from lightning_fl.contexts import FederationSpec
    from lightning_fl.datamodules.federated import FederatedDataModule

__all__ = ["PLACEMENT_OPTIONS", "PLUGIN_GROUPS", "federation_fingerprint", "plugin_settings", "trainer_settings"]

SECRET_NAME = re.compile(r"(^|_)(secret|password|token|keys?)$")
"""Attribute names whose values are secrets: the fingerprint stores a digest of them, never the value."""

_MAX_DEPTH = 3
"""How deep :func:`plugin_settings` follows a plug-in's objects (a bundle's parts, a callback's attack)."""


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    """``value`` as JSON data, with objects replaced by their class names (addresses would differ per process)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return _name(value)


def _name(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _tensor_digest(value: torch.Tensor) -> str:
    data = value.detach().cpu().contiguous()
    return f"digest {_digest([list(data.shape), str(data.dtype), hashlib.sha256(data.numpy().tobytes()).hexdigest()])}"


def _settings(value: Any, key: str, out: dict[str, Any], seen: dict[int, str], depth: int) -> None:
    """Add ``value`` under ``key`` to ``out``: plain data as is, an object as its class and public attributes."""
    if value is None or isinstance(value, bool | int | str):
        out[key] = value
    elif isinstance(value, float):
        out[key] = value if math.isfinite(value) else repr(value)  # NaN != NaN would read as a change
    elif isinstance(value, torch.Tensor):
        out[key] = _tensor_digest(value)
    elif isinstance(value, set | frozenset):
        out[key] = sorted(map(repr, value))
    elif isinstance(value, list | tuple) and all(v is None or isinstance(v, bool | int | str) for v in value):
        out[key] = list(value)
    elif isinstance(value, list | tuple | dict):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        out[key] = f"{type(value).__name__} of {len(value)}"
        for k, v in items:
            _settings(v, f"{key}[{k!r}]" if isinstance(value, dict) else f"{key}[{k}]", out, seen, depth)
    elif id(value) in seen:
        out[key] = f"the object of {seen[id(value)]}"
    else:
        seen[id(value)] = key
        out[key] = _name(value)
        if depth >= _MAX_DEPTH or isinstance(value, nn.Module | type) or not hasattr(value, "__dict__"):
            return
        for name, attr in vars(value).items():
            if name.startswith("_") or inspect.isroutine(attr):
                continue
            if SECRET_NAME.search(name) and attr is not None:
                out[f"{key}.{name}"] = f"digest {_digest(repr(attr))}"
                continue
            _settings(attr, f"{key}.{name}", out, seen, depth + 1)


PLUGIN_GROUPS = (
    "defences",
    "loop.client_transforms",
    "loop.server_transforms",
    "loop.broadcast_transforms",
    "loop.client_callbacks",
    "loop.callbacks",
    "loop.aggregator",
    "loop.selector",
    "server_plugins",
)
"""The config keys whose plug-ins the fingerprint holds (:func:`plugin_settings`), in its order: each plug-in's
settings are keyed under its group (``defences[0].noise_multiplier``)."""


def plugin_settings(groups: dict[str, Any]) -> dict[str, Any]:
    """The settings of each plug-in, flattened to one key per value: ``defences[0].noise_multiplier: 6.0``.

    ``groups`` maps a config key (``defences``, ``loop.aggregator``) to its plug-in or list of them. Settings
    are its public attributes (objects store their arguments under their own names, STYLE.md R3), followed into
    the objects they hold (a bundle's parts, a callback's attack) up to a few levels; an object met before is
    named by its first key, so a defence that is also a client transform appears once. Tensors are stored as
    digests, and so are attributes whose names mark secrets (:data:`SECRET_NAME`). Computed on plug-ins as built,
    before their ``setup`` (which may calibrate sigma or generate keys).

    Example:
        >>> from lightning_fl.defences import GaussianNoise
        >>> plugin_settings({"defences": [GaussianNoise(noise_std=0.1)]})
        {'defences': 'list of 1', 'defences[0]': 'lightning_fl.defences.dp.baselines.GaussianNoise', \
'defences[0].noise_std': 0.1, 'defences[0].unit': 'gradient'}
    """
    out: dict[str, Any] = {}
    seen: dict[int, str] = {}
    for group, plugins in groups.items():
        _settings(plugins, group, out, seen, 0)
    return out


PLACEMENT_OPTIONS = frozenset(
    {
        "accelerator",
        "devices",
        "num_nodes",
        "strategy",
        "logger",
        "enable_checkpointing",
        "enable_progress_bar",
        "enable_model_summary",
        "default_root_dir",
        "log_every_n_steps",
        "profiler",
    }
)
"""``loop.trainer`` options that change where a client trains or what it reports, not what it computes (parallel
runs change nothing but time, DESIGN.md): a run may resume on other devices or with a progress bar."""


def trainer_settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``loop.trainer`` options that change what a client computes, one key each (``loop.trainer.precision``).

    Example:
        >>> trainer_settings({"gradient_clip_val": 0.1, "devices": 2, "enable_progress_bar": False})
        {'loop.trainer.gradient_clip_val': 0.1}
    """
    return {f"loop.trainer.{k}": _plain(v) for k, v in sorted(options.items()) if k not in PLACEMENT_OPTIONS}


def federation_fingerprint(
    *,
    spec: FederationSpec,
    datamodule: FederatedDataModule,
    model: nn.Module,
    defences: Sequence[object],
    aggregator: object,
    selector: object,
    client_transforms: Sequence[object],
    server_transforms: Sequence[object],
    broadcast_transforms: Sequence[object],
    client_callbacks: Sequence[object],
    callbacks: Sequence[object],
    server_plugins: Sequence[object] = (),
    vectorize: bool | str = False,
    trainer: Mapping[str, Any] | None = None,
    norm_bounds: tuple[float, float] = (math.inf, math.inf),
    eval_on: str = "global",
) -> dict[str, Any]:
    """The settings that define a federation, as JSON data: the plug-ins' settings first (:func:`plugin_settings`),
    then the data, the run shape (``vectorize``: ``loop.vectorize``, whose history equals the sequential one only to
    float tolerance), the clients' training (``trainer``: the ``loop.trainer`` options that change what a client
    computes, :func:`trainer_settings`), the server's norm bounds (``loop.max_update_norm_ratio``,
    ``loop.max_update_norm``: they decide which updates are averaged), the evaluation mode (``loop.eval_on``: one
    history must not mix global and client accuracy) and the model.

    Keys are named as in the config (``data.num_clients``, ``loop.local_steps``, ...).
    """
    dm = datamodule
    partition = hashlib.sha256()
    for train, val in dm.client_indices:
        partition.update(np.asarray(train, dtype=np.int64).tobytes() + b"|" + np.asarray(val, dtype=np.int64).tobytes())
    data = {
        f"data.{k}": _plain(getattr(dm, k))
        for k in ("dataset", "num_clients", "partition", "alpha", "val_fraction", "batch_size", "image_size", "seed")
    }
    shapes = [(k, list(v.shape), str(v.dtype)) for k, v in model.state_dict().items()]
    groups = (defences, client_transforms, server_transforms, broadcast_transforms, client_callbacks, callbacks)
    groups += (aggregator, selector, server_plugins)
    plugins = dict(zip(PLUGIN_GROUPS, groups, strict=True))
    if not server_plugins:
        del plugins["server_plugins"]  # runs without one keep their fingerprint
    return {
        **plugin_settings(plugins),
        "seed": spec.seed,
        **data,
        "data.client_indices (digest)": partition.hexdigest()[:16],
        "loop.clients_per_round": spec.clients_per_round,
        "loop.local_epochs": spec.local_epochs,
        "loop.local_steps": spec.local_steps,
        "loop.vectorize": vectorize,
        **trainer_settings(trainer or {}),
        "loop.max_update_norm_ratio": None if math.isinf(norm_bounds[0]) else norm_bounds[0],
        "loop.max_update_norm": None if math.isinf(norm_bounds[1]) else norm_bounds[1],
        "loop.eval_on": eval_on,
        "model": _name(model),
        **{f"model.init_args.{k}": _plain(v) for k, v in dict(getattr(model, "hparams", {}) or {}).items()},
        "model layers and shapes (digest)": _digest(shapes),
    }
