"""Server-side handling of updates: the downlink (broadcast transforms) and the soundness check of an update."""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightning_fl.federation.failures import client_work
from lightning_fl.messages import ClientUpdate
from lightning_fl.validation import update_norm_outliers

if TYPE_CHECKING:
    from lightning_fl.contexts import ClientContext
    from lightning_fl.transforms import BroadcastTransform, ClientTransform

__all__ = [
    "Downlink",
    "against_global",
    "check_aggregate",
    "check_update",
    "decode_aggregate",
    "drop_norm_outliers",
    "encode_update",
    "norm_bounds",
    "payload_error",
    "update_norm",
]


def update_norm(update: ClientUpdate) -> float:
    """The L2 norm of ``update.delta`` over all its tensors, in float64 (float32 overflows to inf near 3e38).

    Example:
        >>> update_norm(ClientUpdate(0, 0, {"a": torch.full((2,), 3e38), "b": torch.zeros(1)}, 1, 0.0)) > 4e38
        True
    """
    total = sum(float(v.detach().double().pow(2).sum()) for v in update.delta.values())
    return math.sqrt(total)


def encode_update(
    update: ClientUpdate, transforms: Sequence[ClientTransform], *, ctx: ClientContext, max_norm: float = math.inf
) -> tuple[ClientUpdate, str | None]:
    """Client side: apply the client transforms in order; returns the update to send and why not to send it.

    An update that a transform encrypts (its ``payload`` appears) is checked against ``max_norm`` by the client
    itself, on the plaintext just before encryption: afterwards the server cannot see its norm.

    Raises:
        ClientFailure: when a transform raised (the client's own work, see :mod:`~lightning_fl.federation.failures`).
    """
    for transform in transforms:
        with client_work(ctx.client_id, f"client transform {type(transform).__name__}"):
            encoded = transform(update, ctx=ctx)
        if update.payload is None and encoded.payload is not None:
            norm = update_norm(update)
            if not norm <= max_norm:
                return encoded, f"its norm {norm:.3g} before encryption exceeds loop.max_update_norm={max_norm:g}"
        update = encoded
    return update, None


def norm_bounds(max_update_norm_ratio: float | None, max_update_norm: float | None) -> tuple[float, float]:
    """Check ``loop.max_update_norm_ratio`` and ``loop.max_update_norm``; returns them with ``None`` (off) as inf.

    Example:
        >>> norm_bounds(1e3, None)
        (1000.0, inf)

    Raises:
        ValueError: on a ratio not > 1 or a bound not > 0, naming the field.
    """
    if max_update_norm_ratio is not None and not max_update_norm_ratio > 1:
        raise ValueError(f"loop.max_update_norm_ratio={max_update_norm_ratio} must be > 1 (or null to disable).")
    if max_update_norm is not None and not max_update_norm > 0:
        raise ValueError(f"loop.max_update_norm={max_update_norm} must be > 0 (or null to disable).")
    ratio = math.inf if max_update_norm_ratio is None else max_update_norm_ratio
    return ratio, math.inf if max_update_norm is None else max_update_norm


def drop_norm_outliers(
    updates: Sequence[ClientUpdate], *, max_ratio: float, max_norm: float, round_idx: int
) -> list[ClientUpdate]:
    """Server side, before aggregation: drop updates whose float64 norm is an outlier, with a warning.

    The rule is :func:`lightning_fl.validation.update_norm_outliers` (``max_ratio`` times the round's lower median,
    or above ``max_norm``), on the norm of what the server can read: the whole delta of a plaintext update, and the
    layers an encrypted update sends in the clear (``PaillierEncryption(layers=...)``). The encrypted layers were
    checked by their clients before encryption (:func:`encode_update`); a client that skips that check is bounded
    there only by the encoding's ``value_bound``.
    """
    norms = [update_norm(u) for u in updates]
    if not updates or (math.isinf(max_ratio) and math.isinf(max_norm)):
        return list(updates)
    outliers = update_norm_outliers(norms, max_ratio=max_ratio, max_norm=max_norm)
    flagged = {updates[i].client_id: norms[i] for i in outliers}
    finite = sorted(n for n in norms if math.isfinite(n))
    median = finite[(len(finite) - 1) // 2] if finite else math.nan
    for client_id, norm in flagged.items():
        reason = (
            f"its norm {norm:.3g} exceeds loop.max_update_norm={max_norm:g}"
            if norm > max_norm
            else f"its norm {norm:.3g} is more than loop.max_update_norm_ratio={max_ratio:g} times the round's "
            f"median update norm {median:.3g}"
        )
        warnings.warn(f"round {round_idx}: update of client {client_id} is dropped: {reason}.", stacklevel=3)
    return [u for u in updates if u.client_id not in flagged]


def check_update(
    update: Any, expected: Mapping[str, torch.Size], *, num_train_samples: int, client_id: int, round_idx: int
) -> str | None:
    """Why ``update`` must be dropped, or ``None``: it is checked whole before the server uses any of it.

    It must be a :class:`ClientUpdate` from the client the server sent this round's work to (``client_id``,
    ``round_idx``): a client cannot speak for another. Its layers (plaintext, plus the ones an encrypted ``payload``
    declares) must be exactly the ``expected`` public layers (their shapes), each a floating-point tensor of that shape
    with values (not on the meta device); its plaintext values finite; its encoded ``payload`` well formed
    (:func:`payload_error`); its ``num_samples`` (the client's FedAvg weight) a whole number, not a string, between 1
    and ``num_train_samples``, the client's data size: a client cannot claim more data than it holds and take over
    the average.

    Example:
        >>> check_update(ClientUpdate(0, 0, {"w": torch.ones(2)}, 10**12, 0.0), {"w": torch.Size([2])},
        ...              num_train_samples=50, client_id=0, round_idx=0)
        'num_samples=1e+12 is not a whole number in 1..50 (the client holds 50 training samples)'
        >>> check_update(ClientUpdate(2, 0, {"w": torch.ones(2)}, 10, 0.0), {"w": torch.Size([2])},
        ...              num_train_samples=50, client_id=0, round_idx=0)
        'it names client 2 and round 0, but the server sent round 0 to client 0'
    """
    if not isinstance(update, ClientUpdate):
        return f"it is a {type(update).__name__}, not a ClientUpdate"
    if update.client_id != client_id or update.round_idx != round_idx:
        return (
            f"it names client {update.client_id!r} and round {update.round_idx!r}, but the server sent round "
            f"{round_idx} to client {client_id}"
        )
    malformed = payload_error(update.payload, round_idx=round_idx)
    if malformed is not None:
        return f"its payload is malformed: {malformed}"
    encrypted = getattr(update.payload, "shapes", {}) if update.payload is not None else {}
    declared = [*update.delta, *encrypted]
    if sorted(declared) != sorted(expected):
        missing, extra = sorted(set(expected) - set(declared)), sorted(set(declared) - set(expected))
        twice = sorted(set(update.delta) & set(encrypted))
        both = f", sent both encrypted and in the clear {twice[:3]}" if twice else ""
        return f"wrong keys (missing {missing[:3]}, unexpected {extra[:3]}{both})"
    for key, shape in encrypted.items():
        if tuple(shape) != tuple(expected[key]):
            return f"encrypted tensor {key!r} is declared with shape {tuple(shape)}, expected {tuple(expected[key])}"
    for key, value in update.delta.items():
        if not isinstance(value, Tensor) or value.shape != expected[key]:
            return f"tensor {key!r} has shape {getattr(value, 'shape', None)}, expected {tuple(expected[key])}"
        if not value.is_floating_point() or value.is_meta:
            return f"tensor {key!r} is {value.dtype} on {value.device}: it holds no floating-point values"
        if not torch.isfinite(value).all():
            return f"tensor {key!r} has non-finite values"
    return _check_num_samples(update.num_samples, num_train_samples)


def payload_error(payload: Any, *, round_idx: int) -> str | None:
    """Why an update's encoded ``payload`` (ciphertexts, masked values) cannot be combined, or ``None``.

    A payload type declares its own structure check, ``structure_error(round_idx=...)`` (Paillier's
    :class:`~lightning_fl.defences.secure_aggregation.paillier.EncryptedTensors`, SecAgg's ``MaskedInput``): the
    number and type of its ciphertexts or ring elements against the layers it declares. It must declare layer
    ``shapes``; a check that raises is a malformed payload too.

    Example:
        >>> payload_error(None, round_idx=0) is None
        True
        >>> payload_error(object(), round_idx=0)
        'it declares no layer shapes (a object)'
    """
    if payload is None:
        return None
    if not isinstance(getattr(payload, "shapes", None), Mapping):
        return f"it declares no layer shapes (a {type(payload).__name__})"
    check = getattr(payload, "structure_error", None)
    if check is None:
        return None
    try:
        return check(round_idx=round_idx)
    except Exception as err:  # the payload is the client's data: any failure to read it is the client's
        return f"its structure could not be read ({type(err).__name__}: {err})"


def _check_num_samples(num_samples: Any, num_train_samples: int) -> str | None:
    """Why a reported ``num_samples`` cannot be a FedAvg weight (not a whole number in 1..n_k), or ``None``."""
    value = float(num_samples) if isinstance(num_samples, numbers.Real) else math.nan
    if math.isfinite(value) and value.is_integer() and 1 <= value <= num_train_samples:
        return None
    return (
        f"num_samples={value:.3g} is not a whole number in 1..{num_train_samples} (the client holds "
        f"{num_train_samples} training samples)"
    )


def decode_aggregate(aggregate: Any, transforms: Sequence[ClientTransform], *, ctx: ClientContext, source: Any) -> dict:
    """Client side, after aggregation: the client transforms, in reverse order, decode the aggregate (decrypt).

    Raises:
        TypeError: if what ``source`` (the aggregator) returned is still not a dict of tensors afterwards.
    """
    for transform in reversed(transforms):
        aggregate = transform.decode_aggregate(aggregate, ctx=ctx)
    if not isinstance(aggregate, dict):
        raise TypeError(
            f"loop.aggregator={type(source).__name__} returned a {type(aggregate).__name__} that no client "
            "transform decoded; add the matching client transform (e.g. PaillierEncryption)."
        )
    return aggregate


def check_aggregate(delta: Mapping[str, Tensor], *, round_idx: int) -> None:
    """Refuse an aggregate with non-finite values before it reaches the global model.

    Raises:
        RuntimeError: naming the first such tensors.
    """
    bad = [k for k, v in delta.items() if not torch.isfinite(v).all()]
    if bad:
        raise RuntimeError(
            f"round {round_idx}: the aggregate has non-finite values in {bad[:3]}; the global model was left unchanged."
        )


class Downlink:
    """What the server sends each client: the public global state through the broadcast transforms.

    When a transform is ``persistent`` (2DP-FL's downlink noise), :meth:`send` also returns the offset it sent, and
    :func:`against_global` adds it back, ``delta + (received - global) = w_k - w``, so aggregation averages client
    models instead of forgetting what the broadcast added.
    """

    def __init__(self, transforms: Sequence[BroadcastTransform]) -> None:
        self.transforms = tuple(transforms)

    def send(self, ctx: ClientContext) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
        """The state client ``ctx.client_id`` receives (the context's copies, so the client cannot touch the global
        model), and the offset from the global state a persistent broadcast added (``None`` without one)."""
        state = dict(ctx.global_state)
        for transform in self.transforms:
            state = transform(state, ctx=ctx)
        if not any(t.persistent for t in self.transforms):
            return state, None
        public = ctx.global_state
        return state, {k: state[k] - public[k] for k in ctx.spec.update_keys}


def against_global(update: ClientUpdate, offset: Mapping[str, Tensor] | None) -> ClientUpdate:
    """Measure ``update`` against the global state when its broadcast added ``offset`` (see :class:`Downlink`).

    Raises:
        ValueError: for an encrypted update after a persistent broadcast (ciphertexts cannot take the offset).

    Example:
        >>> update = ClientUpdate(0, 0, {"w": torch.ones(1)}, 1, 0.0)
        >>> against_global(update, {"w": torch.full((1,), 2.0)}).delta
        {'w': tensor([3.])}
    """
    if offset is None:
        return update
    if update.payload is not None:
        raise ValueError(
            "a persistent broadcast transform cannot be combined with an encrypted update payload; "
            "the server cannot add the broadcast offset to ciphertexts."
        )
    return dataclasses.replace(update, delta={k: v + offset[k] for k, v in update.delta.items()})
