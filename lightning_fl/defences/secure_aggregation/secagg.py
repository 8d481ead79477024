r"""Secure aggregation by pairwise masking with dropout recovery (Bonawitz et al., CCS 2017, Fig. 4, semi-honest).

One round of the protocol among the round's selected clients :math:`U_1`, with threshold :math:`t`:

0. *AdvertiseKeys*: each client :math:`u` draws a fresh Diffie-Hellman key pair :math:`(s_u^{SK}, s_u^{PK})`;
   the server relays the public keys.
1. *ShareKeys*: :math:`u` draws a self-mask seed :math:`b_u` and Shamir-shares :math:`s_u^{SK}` and :math:`b_u`
   t-out-of-:math:`|U_1|` among :math:`U_1`.
2. *MaskedInputCollection*: a client :math:`u \in U_2` that finished training sends
   :math:`y_u = x_u + \mathrm{PRG}(b_u) + \sum_{v \in U_1, u<v}\mathrm{PRG}(s_{u,v}) - \sum_{v\in U_1, u>v}
   \mathrm{PRG}(s_{u,v}) \bmod R`, with :math:`x_u = n_u\Delta_u` in fixed point and
   :math:`s_{u,v} = \mathrm{KA}(s_u^{SK}, s_v^{PK})`.
4. *Unmasking*: every survivor sends its shares of :math:`b_v` for survivors and of :math:`s_v^{SK}` for clients
   that dropped (never both for one client); the server rebuilds them, removes the self-masks and the dropped
   clients' pairwise masks, and learns :math:`\sum_{u\in U_2} x_u` only.

In this simulation the clients' devices are the :class:`_Device` objects of :class:`SecAggMasking` (client-side
state, never handed to the server side); the server side is :class:`SecAggSum`, which sees public keys, masked
inputs and the unmasking responses. Round 3 (consistency checks) belongs to the active-adversary variant and is
not run. Deviation: the loop keeps the decoded global model, as for Paillier.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from typing_extensions import override

from lightning_fl.callbacks.base import FederatedCallback
from lightning_fl.defences.base import Defence, DefenceParts
from lightning_fl.defences.secure_aggregation.masking import (
    agree,
    decode,
    encode,
    generate_private_key,
    prg_mask,
    public_key,
    shamir_reconstruct,
    shamir_share,
)
from lightning_fl.messages import ClientUpdate
from lightning_fl.server.aggregation import Aggregator
from lightning_fl.transforms import ClientTransform

if TYPE_CHECKING:
    from lightning_fl.contexts import ClientContext, RoundContext
    from lightning_fl.view import FederationView

__all__ = ["MaskedInput", "SecAggMasking", "SecAggSum"]

_SHARE_BYTES = 66  # one element of the 521-bit Shamir field
_KEY_BYTES = 256  # one element of the 2048-bit DH group


@dataclass(frozen=True)
class MaskedInput:
    """What a client uploads in round 2: its weighted update in fixed point plus masks, per layer, in Z_R.

    Args:
        masked: the layers (sorted by name, flattened, concatenated) as int64 in :math:`[0, 2^{bits})`.
        round_idx: the round whose keys masked it.
        shapes: each layer's name and shape, in the order of ``masked`` (as ``PaillierEncrypted.shapes``: the
            server checks an update's declared layers against the model's).
    """

    masked: Tensor
    round_idx: int
    shapes: dict[str, tuple[int, ...]]

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: one ``bits``-bit ring element per value, sent as 8 bytes."""
        return self.masked.numel() * 8

    def structure_error(self, *, round_idx: int) -> str | None:
        """Server side, on arrival: why this is not a masked input of round ``round_idx``, or ``None``.

        It must be a flat ``int64`` tensor with one ring element per value of the layers it declares, masked with
        this round's keys; a truncated one would otherwise fail inside the unmasking sum.

        Example:
            >>> MaskedInput(torch.zeros(2, dtype=torch.int64), 0, {"w": (3,)}).structure_error(round_idx=0)
            'its masked values are a Tensor of shape (2,) and torch.int64, expected a flat int64 tensor of 3 values'
        """
        if self.round_idx != round_idx:
            return f"it was masked with the keys of round {self.round_idx!r}, not of round {round_idx}"
        shapes = self.shapes if isinstance(self.shapes, dict) else {}
        if not all(isinstance(s, tuple) and all(isinstance(d, int) and d >= 0 for d in s) for s in shapes.values()):
            return f"its declared shapes {self.shapes!r} are not a mapping of layer names to shapes"
        count = sum(math.prod(s) for s in shapes.values())
        masked = self.masked
        if not (isinstance(masked, Tensor) and masked.dtype == torch.int64 and not masked.is_meta) or tuple(
            masked.shape
        ) != (count,):
            return (
                f"its masked values are a {type(masked).__name__} of shape {tuple(getattr(masked, 'shape', ()))} "
                f"and {getattr(masked, 'dtype', None)}, expected a flat int64 tensor of {count} values"
            )
        return None


@dataclass(frozen=True)
class RoundKeys:
    """The public outcome of rounds 0-1: the round, the relayed public keys of :math:`U_1`, the threshold."""

    round_idx: int
    public_keys: dict[int, int]
    threshold: int


@dataclass
class _Device:
    """One client's secrets for one round: its DH private key, self-mask seed, and the shares it holds."""

    mask_key: int
    self_seed: int
    held: dict[int, tuple[int, int]] = field(default_factory=dict)  # owner -> (share of s^SK, share of b)


class SecAggMasking(ClientTransform, FederatedCallback, Defence):
    r"""Bonawitz et al.'s secure aggregation (CCS 2017): the clients' half and the bundle that wires both halves.

    Put it in ``loop.defences`` (YAML: ``defences: [{class_path: lightning_fl.defences.SecAggMasking}]``); it
    brings its aggregator :class:`SecAggSum` (FedAvg on the unmasked sum). Costs are logged every round:
    ``secagg_mask_s`` (clients' masking), ``secagg_unmask_s`` (server), ``secagg_upload_bytes`` (per client,
    masked input + public key + shares sent + unmasking response) and ``secagg_dropped``.

    Args:
        threshold: Shamir threshold :math:`t` as a fraction of :math:`|U_1|`; :math:`t = \lfloor
            \mathrm{threshold}\cdot|U_1|\rfloor + 1`. The sum is recovered while at least :math:`t` clients
            survive; fewer than :math:`t` colluding clients learn nothing about a client's masks. Bonawitz et al.
            require :math:`t > |U_1|/2` against a semi-honest server (default 0.5).
        precision_bits: fixed-point fractional bits :math:`f` (step :math:`2^{-f}`).
        bits: the ring :math:`\mathbb Z_{2^{bits}}` of masked values; the weighted sum
            :math:`\sum_u n_u\Delta_u` must stay within :math:`\pm 2^{bits-f-1}`.
        weighted: FedAvg weights :math:`n_u` (the sum is divided by :math:`\sum_{u\in U_2} n_u`) or a plain mean.

    Raises:
        ValueError: on a threshold outside [0.5, 1), or a ring too small for the precision.
    """

    hides_update = True

    def __init__(
        self, *, threshold: float = 0.5, precision_bits: int = 24, bits: int = 62, weighted: bool = True
    ) -> None:
        if not 0.5 <= threshold < 1:
            raise ValueError(
                f"SecAggMasking(threshold={threshold}) must be in [0.5, 1): t = floor(threshold*|U1|) + 1 clients "
                "must survive, and t > |U1|/2 keeps a semi-honest server from unmasking anyone."
            )
        if not 8 <= precision_bits <= bits - 16 or bits > 62:
            raise ValueError(
                f"SecAggMasking(precision_bits={precision_bits}, bits={bits}): need 8 <= precision_bits <= bits - 16 "
                "and bits <= 62 (int64 sums)."
            )
        self.threshold, self.precision_bits, self.bits, self.weighted = threshold, precision_bits, bits, weighted
        self.round_keys: RoundKeys | None = None
        self._devices: dict[int, _Device] = {}
        self._cost: dict[str, float] = {}

    @override
    def parts(self) -> DefenceParts:
        return DefenceParts(client_transforms=[self], callbacks=[self], aggregator=SecAggSum(self))

    # -- rounds 0-1, on the selected clients' devices ------------------------------------------------------
    @override
    def on_round_start(self, federation: FederationView, round_idx: int, selected: list[int]) -> None:
        self.setup_round(round_idx, selected)

    def setup_round(self, round_idx: int, clients: Sequence[int]) -> RoundKeys:
        """AdvertiseKeys and ShareKeys for ``clients`` (:math:`U_1`); returns the public keys the server relays."""
        threshold = math.floor(self.threshold * len(clients)) + 1
        self._devices = {u: _Device(generate_private_key(), secrets.randbits(256)) for u in clients}
        for owner, device in self._devices.items():
            key_shares = shamir_share(device.mask_key, holders=clients, threshold=threshold)
            seed_shares = shamir_share(device.self_seed, holders=clients, threshold=threshold)
            for holder in clients:
                self._devices[holder].held[owner] = (key_shares[holder], seed_shares[holder])
        keys = {u: public_key(d.mask_key) for u, d in self._devices.items()}
        self.round_keys = RoundKeys(round_idx, keys, threshold)
        share_bytes = 2 * (len(clients) - 1) * _SHARE_BYTES
        self._cost = {"secagg_upload_bytes": float(_KEY_BYTES + share_bytes), "secagg_mask_s": 0.0}
        return self.round_keys

    # -- round 2, on a client that finished training -------------------------------------------------------
    @override
    def __call__(self, update: ClientUpdate, *, ctx: ClientContext) -> ClientUpdate:
        keys, device = self.round_keys, self._devices.get(update.client_id)
        if keys is None or device is None or keys.round_idx != ctx.round_idx:
            raise RuntimeError(f"client {update.client_id} holds no SecAgg keys for round {ctx.round_idx}.")
        start = time.perf_counter()
        weight = update.num_samples if self.weighted else 1
        flat = torch.cat([weight * delta.double().flatten() for _, delta in sorted(update.delta.items())])
        value = encode(flat, precision_bits=self.precision_bits, bits=self.bits)
        value = value + self._prg(_self_mask_seed(device.self_seed, keys.round_idx), value.numel())
        for other, other_key in keys.public_keys.items():
            if other != update.client_id:
                mask = self._prg(agree(device.mask_key, other_key, keys.round_idx), value.numel())
                value = value + mask if update.client_id < other else value - mask
        payload = MaskedInput(torch.remainder(value, 2**self.bits), keys.round_idx, _shapes(update.delta))
        self._cost["secagg_mask_s"] += time.perf_counter() - start
        upload = self._cost["secagg_upload_bytes"] + payload.nbytes
        ctx.log_metrics({"secagg_mask_s": self._cost["secagg_mask_s"], "secagg_upload_bytes": upload})
        return dataclasses.replace(update, delta={}, payload=payload)

    def _prg(self, seed: bytes, numel: int) -> Tensor:
        return prg_mask(seed, numel, bits=self.bits)

    # -- round 4, on a surviving client ------------------------------------------------------------------
    def unmasking_response(self, client_id: int, *, dropped: Sequence[int], survivors: Sequence[int]) -> dict:
        """Client ``client_id``'s shares: of :math:`s_v^{SK}` for dropped ``v``, of :math:`b_v` for survivors.

        Raises:
            ValueError: if one client is named both dropped and surviving: revealing both of its secrets would
                let the server unmask its input (Bonawitz et al., Fig. 4, round 4 check).
        """
        if set(dropped) & set(survivors):
            raise ValueError(
                f"client {client_id} refuses to unmask: {sorted(set(dropped) & set(survivors))} are named both "
                "dropped and surviving."
            )
        held = self._devices[client_id].held
        return {
            "mask_keys": {v: held[v][0] for v in dropped},
            "self_seeds": {v: held[v][1] for v in survivors},
        }


class SecAggSum(Aggregator):
    """The server of :class:`SecAggMasking`: adds masked inputs mod R, runs the unmasking round, decodes the sum.

    It reads only public keys, masked inputs and the survivors' unmasking responses, and returns the FedAvg
    aggregate :math:`\\sum_{u\\in U_2} n_u\\Delta_u / \\sum_{u\\in U_2} n_u` in plaintext.

    Args:
        protocol: the clients' half, through which the round's public keys and the unmasking responses arrive.

    Raises:
        ValueError: when fewer than :math:`t` clients survive (the protocol aborts), or on an update without a
            masked input.
    """

    def __init__(self, protocol: SecAggMasking) -> None:
        self.protocol = protocol

    @override
    def aggregate(
        self, updates: Sequence[ClientUpdate], *, ctx: RoundContext | None
    ) -> tuple[dict[str, Tensor], dict[str, float]]:
        keys, protocol = self.protocol.round_keys, self.protocol
        if keys is None or any(not isinstance(u.payload, MaskedInput) for u in updates):
            raise ValueError("SecAggSum needs masked inputs from SecAggMasking; put SecAggMasking in loop.defences.")
        survivors = [u.client_id for u in updates]
        dropped = [v for v in keys.public_keys if v not in survivors]
        if len(survivors) < keys.threshold:
            raise ValueError(
                f"SecAgg round {keys.round_idx}: {len(survivors)} clients survived, fewer than the threshold "
                f"t={keys.threshold}; the sum cannot be unmasked (lower SecAggMasking(threshold=...))."
            )
        start = time.perf_counter()
        total = sum(u.payload.masked for u in updates)
        responses = {u: protocol.unmasking_response(u, dropped=dropped, survivors=survivors) for u in survivors}
        for v in survivors:
            seed = shamir_reconstruct({u: r["self_seeds"][v] for u, r in responses.items()})
            total = total - protocol._prg(_self_mask_seed(seed, keys.round_idx), total.numel())
        for v in dropped:
            mask_key = shamir_reconstruct({u: r["mask_keys"][v] for u, r in responses.items()})
            for u in survivors:  # u added +PRG(s_uv) if u < v, else -PRG(s_uv)
                mask = protocol._prg(agree(mask_key, keys.public_keys[u], keys.round_idx), total.numel())
                total = total - mask if u < v else total + mask
        total = decode(
            torch.remainder(total, 2**protocol.bits), precision_bits=protocol.precision_bits, bits=protocol.bits
        )
        weight = sum(u.num_samples for u in updates) if protocol.weighted else len(updates)
        aggregate, offset = {}, 0
        for name, shape in updates[0].payload.shapes.items():
            numel = math.prod(shape)
            aggregate[name] = (total[offset : offset + numel] / weight).float().view(shape)
            offset += numel
        metrics = {"secagg_unmask_s": time.perf_counter() - start, "secagg_dropped": float(len(dropped))}
        metrics["secagg_response_bytes"] = float((len(dropped) + len(survivors)) * _SHARE_BYTES)  # per survivor
        return aggregate, metrics


def _shapes(delta: dict[str, Tensor]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in sorted(delta.items())}


def _self_mask_seed(self_seed: int, round_idx: int) -> bytes:
    return self_seed.to_bytes(32, "big") + f"/self/{round_idx}".encode()
