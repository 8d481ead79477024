r"""Secure aggregation with Paillier: clients encrypt their updates, the server only adds ciphertexts.

Implements the HE aggregation of the thesis (Ren, Swansea 2023, Sec. 4.2.2, Algorithms 2-3) for any
aggregation rule with integer weights, FedAvg included ("the proposed secure aggregation approach ... can
also be used for FedAvg"), on the packed fixed-point encoding of
:mod:`lightning_fl.defences.secure_aggregation.paillier`.

Who holds what:

* **Key ceremony (client side).** At the start of the run the key-holder client (the thesis' C1) generates
  the key pair and shares it with the other clients (Algorithm 3, lines 1-5). The private key lives only in
  the clients' own storage (``ClientState.extra``, written to the client checkpoints, never to the server's).
* **Clients** encrypt their update with the public key (:class:`PaillierEncryption`, a client transform);
  the :class:`~lightning_fl.messages.ClientUpdate` then carries the ciphertexts in ``payload`` and only the
  layers left unencrypted (``layers=``) in ``delta``.
* **The server** (:class:`SecureFedAvg`, or :class:`~lightning_fl.server.fedboosting.FedBoosting`) holds the
  public key and ciphertexts only: it multiplies ciphertexts by plaintext integer weights and adds them, and
  returns an :class:`EncryptedAggregate`.
* **Clients decrypt the aggregate**: the loop hands what the aggregator returns to the client transforms'
  ``decode_aggregate`` (client side), which decrypts with a client's key; FedBoosting's cross-validation models
  reach the clients through the same step (:class:`~lightning_fl.federation.evaluation.ClientEvaluation`), so
  their downloads count in ``he_download_bytes``. The server-side leak point
  ("aggregate") therefore sees only the plaintext layers, and attacks on a client update see only those too.

Deviation: in the thesis the server never learns the global model before the last round; in this simulation
the loop keeps the (decrypted) global model for evaluation and broadcasting, so server transforms, which
would run on the decrypted aggregate, get a warning.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import Tensor
from typing_extensions import override

from lightning_fl.defences.base import Defence, DefenceParts
from lightning_fl.defences.secure_aggregation.paillier import (
    PackingSpec,
    decrypt_tensors,
    encrypt_tensors,
    generate_keypair,
    private_key_from_state,
    private_key_state,
)
from lightning_fl.messages import ClientUpdate
from lightning_fl.server.encrypted import EncryptedAggregate, PaillierAggregator, check_payloads, combine_updates
from lightning_fl.transforms import ClientTransform

if TYPE_CHECKING:
    from phe.paillier import PaillierPublicKey

    from lightning_fl.contexts import ClientContext, ClientSetupContext, ClientState, RoundContext, SetupContext


__all__ = [
    "EncryptedAggregate",
    "PaillierAggregator",
    "PaillierEncryption",
    "SecureFedAvg",
    "check_payloads",
    "client_side_decrypt",
    "combine_updates",
]

#: Where each client keeps the shared Paillier private key (as integers) in ``ClientState.extra``.
KEY_FIELD = "paillier_private_key"


def client_side_decrypt(message: dict[str, Tensor] | EncryptedAggregate, *, client: ClientState) -> dict[str, Tensor]:
    """``client`` decrypts what the server sent with its own copy of the private key.

    Plaintext messages pass through unchanged.

    Raises:
        RuntimeError: if the client holds no Paillier key (no :class:`PaillierEncryption` transform ran setup).
    """
    if not isinstance(message, EncryptedAggregate):
        return message
    stored = client.extra.get(KEY_FIELD)
    if stored is None:
        raise RuntimeError(
            f"client {client.client_id} holds no Paillier key; add PaillierEncryption to loop.client_transforms."
        )
    decrypted = decrypt_tensors(message.encrypted, private_key=private_key_from_state(stored))
    return {**decrypted, **message.plaintext}


class SecureFedAvg(PaillierAggregator):
    """FedAvg (McMahan et al., AISTATS 2017) on Paillier ciphertexts: :math:`\\sum_k n_k \\Delta_k / \\sum_k n_k`.

    The integer weights are the sample counts :math:`n_k` themselves, so the encrypted aggregate equals the
    plaintext FedAvg aggregate up to the fixed-point step (no weight quantisation). Plaintext updates are
    averaged exactly like :class:`~lightning_fl.server.FedAvg`.

    Args:
        weighted: weight each client by its number of training samples (the paper); if false, a plain mean.

    Example:
        >>> import torch
        >>> u = [ClientUpdate(k, 0, {"w": torch.tensor([float(k)])}, 10 * (k + 1), 0.0) for k in range(2)]
        >>> SecureFedAvg().aggregate(u, ctx=None)
        ({'w': tensor([0.6667])}, {})
    """

    needs_encryption = True

    def __init__(self, *, weighted: bool = True) -> None:
        self.weighted = weighted

    @override
    def max_weight_sum(self, ctx: SetupContext) -> int:
        if not self.weighted:
            return ctx.spec.clients_per_round
        return sum(sorted(ctx.spec.num_train_samples, reverse=True)[: ctx.spec.clients_per_round])

    @override
    def aggregate(
        self, updates: Sequence[ClientUpdate], *, ctx: RoundContext | None
    ) -> tuple[dict[str, Tensor] | EncryptedAggregate, dict[str, float]]:
        check_payloads(updates, global_state=dict(ctx.global_state) if ctx is not None else {})
        weights = [u.num_samples if self.weighted else 1 for u in updates]
        return combine_updates(updates, weights=weights, normaliser=sum(weights)), {}


class PaillierEncryption(ClientTransform, Defence):
    """Client side of Paillier secure aggregation: encrypt each update, decrypt the aggregate.

    Put it last in ``loop.client_transforms`` (after clipping or noise) and use a Paillier-aware aggregator
    (:class:`SecureFedAvg` or :class:`~lightning_fl.server.fedboosting.FedBoosting`). Encryption, aggregation
    and decryption time, uploaded and downloaded ciphertext bytes and the number of clipped values are logged
    every round (``he_*`` metrics in the history and the loggers).

    Args:
        key_size: Paillier key size in bits; 2048 by default. Smaller keys warn: tests and quick runs only.
        precision_bits: fixed-point fractional bits (step :math:`2^{-f}`); see :class:`PackingSpec`.
        value_bound: update entries are clipped to :math:`\\pm` this before encoding.
        max_weight_sum: headroom for the aggregator's integer weights; checked against the aggregator at setup.
        packing: pack many values per ciphertext (BatchCrypt); ``False`` encrypts one value per ciphertext.
        layers: ``fnmatch`` patterns of the state-dict names to encrypt (e.g. ``["backbone.fc*"]``); the
            other layers are sent in the clear. ``None`` encrypts every layer.
        key_holder: the client that generates the key pair and shares it with the others (the thesis' C1).

    Raises:
        ValueError: on an impossible packing budget (at construction), and at setup on an aggregator that
            cannot read ciphertexts, too little headroom for it, a pattern that matches no layer, or an
            unknown ``key_holder``.
    """

    encrypts = hides_update = True

    def __init__(
        self,
        *,
        key_size: int = 2048,
        precision_bits: int = 20,
        value_bound: float = 4.0,
        max_weight_sum: int = 2**16,
        packing: bool = True,
        layers: Sequence[str] | None = None,
        key_holder: int = 0,
    ) -> None:
        self.spec = PackingSpec(
            key_size=key_size,
            precision_bits=precision_bits,
            value_bound=value_bound,
            max_weight_sum=max_weight_sum,
            packing=packing,
        )
        self.key_size, self.precision_bits, self.value_bound = key_size, precision_bits, value_bound
        self.max_weight_sum, self.packing, self.key_holder = max_weight_sum, packing, key_holder
        self.layers = list(layers) if layers is not None else None
        self.public_key: PaillierPublicKey | None = None
        self._round_cost: dict[str, float] = {}
        self._cost_round: int | None = None

    # -- setup: checks and the key ceremony ------------------------------------------------------------
    @override
    def setup(self, ctx: SetupContext) -> None:
        self._check_run(ctx)

    @override
    def setup_clients(self, ctx: ClientSetupContext) -> None:
        stored = next((c.extra[KEY_FIELD] for c in ctx.clients if KEY_FIELD in c.extra), None)
        private_key = private_key_from_state(stored) if stored is not None else None  # a resumed run's key
        if private_key is None or private_key.public_key.n.bit_length() != self.key_size:
            _, private_key = generate_keypair(spec=self.spec)  # on the key holder, Algorithm 3 line 2
        shared = private_key_state(private_key)
        for client in ctx.clients:  # the key holder shares the key pair with every client (line 2-4)
            client.extra[KEY_FIELD] = dict(shared)
        self.public_key = private_key.public_key

    def _check_run(self, ctx: SetupContext) -> None:
        if not isinstance(ctx.aggregator, PaillierAggregator):
            raise ValueError(
                f"loop.aggregator={type(ctx.aggregator).__name__} cannot read Paillier ciphertexts; use "
                "SecureFedAvg or FedBoosting with PaillierEncryption."
            )
        needed = ctx.aggregator.max_weight_sum(ctx)
        if needed > self.max_weight_sum:
            raise ValueError(
                f"PaillierEncryption(max_weight_sum={self.max_weight_sum}) is below the {needed} that "
                f"{type(ctx.aggregator).__name__} may apply in one round; the packed slots could overflow. "
                f"Set max_weight_sum >= {needed} (PackingSpec then checks it still fits the key)."
            )
        if not 0 <= self.key_holder < ctx.spec.num_clients:
            raise ValueError(
                f"PaillierEncryption(key_holder={self.key_holder}) is not a client of {ctx.spec.num_clients}."
            )
        names = list(ctx.spec.update_keys)
        for pattern in self.layers or ():
            if not fnmatch.filter(names, pattern):
                raise ValueError(
                    f"PaillierEncryption(layers=[..., {pattern!r}, ...]) matches no public layer; "
                    f"layers are {names[:8]}{' ...' if len(names) > 8 else ''}."
                )
        if ctx.server_transforms:
            warnings.warn(
                "loop.server_transforms run on the decrypted aggregate, which a real Paillier server never sees; "
                "their results do not describe a deployable protocol.",
                stacklevel=2,
            )

    # -- the two client-side steps -----------------------------------------------------------------------
    def _encrypts(self, name: str) -> bool:
        return self.layers is None or any(fnmatch.fnmatchcase(name, p) for p in self.layers)

    @override
    def parts(self) -> DefenceParts:
        return DefenceParts(client_transforms=[self])

    @override
    def __call__(self, update: ClientUpdate, *, ctx: ClientContext) -> ClientUpdate:
        if self.public_key is None:
            raise RuntimeError("PaillierEncryption has no public key; FederatedLoop.fit() calls setup(ctx) first.")
        secret = {k: v for k, v in update.delta.items() if self._encrypts(k)}
        clear = {k: v for k, v in update.delta.items() if not self._encrypts(k)}
        start = time.perf_counter()
        payload = encrypt_tensors(secret, public_key=self.public_key, spec=self.spec)
        elapsed = time.perf_counter() - start
        clipped = sum(int((v.abs() > self.value_bound).sum()) for v in secret.values())
        if clipped:
            warnings.warn(
                f"client {update.client_id}: {clipped} update values exceed value_bound={self.value_bound} and "
                "were clipped before encryption; raise PaillierEncryption(value_bound=...).",
                stacklevel=2,
            )
        self._log_cost(
            ctx,
            he_encrypt_s=elapsed,
            he_upload_bytes=payload.nbytes,
            he_ciphertexts=len(payload.ciphertexts),
            he_clipped_values=clipped,
        )
        return dataclasses.replace(update, delta=clear, payload=payload)

    @override
    def decode_aggregate(self, aggregate: Any, *, ctx: ClientContext) -> Any:
        if not isinstance(aggregate, EncryptedAggregate):
            return aggregate
        if aggregate.sender == ctx.client_id:  # its own update: the simulation decrypts what the client holds
            return client_side_decrypt(aggregate, client=ctx.state)
        start = time.perf_counter()
        delta = client_side_decrypt(aggregate, client=ctx.state)
        cost = {"he_decrypt_s": time.perf_counter() - start, "he_download_bytes": aggregate.encrypted.nbytes}
        self._log_cost(ctx, **cost, **aggregate.cost)
        return delta

    def _log_cost(self, ctx: RoundContext, **cost: float) -> None:
        """Add ``cost`` to this round's totals and hand the totals to ``ctx.log_metrics``."""
        if self._cost_round != ctx.round_idx:
            self._round_cost, self._cost_round = {}, ctx.round_idx
        for key, value in cost.items():
            self._round_cost[key] = self._round_cost.get(key, 0.0) + float(value)
        ctx.log_metrics(dict(self._round_cost))
