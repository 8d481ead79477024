"""The fingerprint of a federation: the settings a resumed run must share with the run it continues.

A checkpoint's manifest stores it; resume compares it key by key and refuses a run whose clients, partition,
seed, local work, model layers or plug-ins differ, naming the keys (a changed ``num_rounds`` is allowed: it is how
a run is extended). Digests stand in for what is too long to store (partition indices, layer shapes).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import nn

if TYPE_CHECKING:
    from lightning_fl.contexts import FederationSpec
    from lightning_fl.datamodules.federated import FederatedDataModule

__all__ = ["federation_fingerprint"]


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


def federation_fingerprint(
    *,
    spec: FederationSpec,
    datamodule: FederatedDataModule,
    model: nn.Module,
    aggregator: object,
    selector: object,
    client_transforms: Sequence[object],
    server_transforms: Sequence[object],
    broadcast_transforms: Sequence[object],
    callbacks: Sequence[object],
) -> dict[str, Any]:
    """The settings that define a federation, as JSON data.

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
    return {
        "seed": spec.seed,
        **data,
        "data.client_indices (digest)": partition.hexdigest()[:16],
        "loop.clients_per_round": spec.clients_per_round,
        "loop.local_epochs": spec.local_epochs,
        "loop.local_steps": spec.local_steps,
        "model": _name(model),
        **{f"model.init_args.{k}": _plain(v) for k, v in dict(getattr(model, "hparams", {}) or {}).items()},
        "model layers and shapes (digest)": _digest(shapes),
        "loop.aggregator": _name(aggregator),
        "loop.selector": _name(selector),
        "loop.client_transforms": [_name(t) for t in client_transforms],
        "loop.server_transforms": [_name(t) for t in server_transforms],
        "loop.broadcast_transforms": [_name(t) for t in broadcast_transforms],
        "loop.callbacks": [_name(cb) for cb in callbacks],
    }
