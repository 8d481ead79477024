"""Checks that a run's plug-ins compose: orders and combinations that would run but do something else than asked.

Each rule raises one ``ValueError`` that names the plug-ins and the fix; :class:`~lightning_fl.federation.FederatedLoop`
applies them when it is built (the ``lightning-fl`` command then exits with 2 before writing anything). A defence
given twice, in one list or in ``defences`` and ``loop.*``, is refused by one rule,
:func:`~lightning_fl.defences.base.check_defences_once`; the order of model defences is handled by
:func:`~lightning_fl.defences.apply_defences`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_fl.callbacks.privacy_budget import PrivacyBudget
from lightning_fl.defences.base import check_defences_once
from lightning_fl.defences.secure_aggregation.protocol import PaillierEncryption, SecureFedAvg
from lightning_fl.defences.secure_aggregation.secagg import SecAggMasking
from lightning_fl.privacy.accounting import PrivacyLedger
from lightning_fl.server.robust import RobustAggregator

__all__ = [
    "check_budget_has_ledger",
    "check_composition",
    "check_encryption_last",
    "check_robust_reads_plaintext",
    "check_secure_aggregation",
    "check_secure_aggregation_has_company",
]


def _chain(transforms: Sequence[Any]) -> str:
    return "[" + ", ".join(type(t).__name__ for t in transforms) + "]"


def check_encryption_last(client_transforms: Sequence[Any]) -> None:
    """At most one :class:`PaillierEncryption`, and it ends the client chain.

    A transform after it sees an update whose encrypted layers are gone from ``delta``: noise, clipping or pruning
    there changes nothing (or only the layers sent in the clear), and a second encryption finds nothing left to
    encrypt and freezes the layers the first one encrypted.

    Raises:
        ValueError: naming the chain and the fix.

    Example:
        >>> from lightning_fl.defences import GaussianNoise
        >>> check_encryption_last([GaussianNoise(0.1), PaillierEncryption(key_size=256, max_weight_sum=4)])
    """
    positions = [i for i, t in enumerate(client_transforms) if isinstance(t, PaillierEncryption)]
    if len(positions) > 1:
        raise ValueError(
            f"the client transforms {_chain(client_transforms)} encrypt twice (PaillierEncryption at "
            f"{positions}); keep one PaillierEncryption (give it in defences or loop.client_transforms, not both)."
        )
    if positions and positions[0] != len(client_transforms) - 1:
        after = type(client_transforms[positions[0] + 1]).__name__
        raise ValueError(
            f"the client transforms {_chain(client_transforms)} run {after} after PaillierEncryption, on an update "
            f"whose encrypted layers it cannot see; put PaillierEncryption last (clip, noise and prune before "
            "encryption)."
        )


def check_secure_aggregation(aggregator: Any, client_transforms: Sequence[Any]) -> None:
    """:class:`SecureFedAvg` needs clients that encrypt: without them it is plain FedAvg under a secure name.

    Raises:
        ValueError: when no client transform is a :class:`PaillierEncryption`.
    """
    if isinstance(aggregator, SecureFedAvg) and not any(isinstance(t, PaillierEncryption) for t in client_transforms):
        raise ValueError(
            "loop.aggregator=SecureFedAvg but no client transform encrypts, so it would average plaintext updates; "
            "add PaillierEncryption to defences (or loop.client_transforms), or use FedAvg."
        )


def check_robust_reads_plaintext(aggregator: Any, client_transforms: Sequence[Any]) -> None:
    """A :class:`~lightning_fl.server.RobustAggregator` compares the clients' plaintext updates; encryption
    (Paillier, secure aggregation masks) hides them, so the two cannot be combined.

    Raises:
        ValueError: naming the aggregator, the encrypting transform and the two ways out.

    Example:
        >>> from lightning_fl.server import TrimmedMean
        >>> check_robust_reads_plaintext(TrimmedMean(), [])
    """
    hiding = [t for t in client_transforms if isinstance(t, PaillierEncryption | SecAggMasking)]
    if isinstance(aggregator, RobustAggregator) and hiding:
        raise ValueError(
            f"loop.aggregator={type(aggregator).__name__} compares the clients' plaintext updates, but "
            f"{type(hiding[0]).__name__} encrypts them; drop the encryption or use its own aggregator "
            "(docs/architecture.md, 'What the server checks', says which checks remain under encryption)."
        )


def check_budget_has_ledger(callbacks: Sequence[Any], components: Sequence[Any]) -> None:
    """A :class:`PrivacyBudget` needs a privacy ledger (a DP defence) to read the spent epsilon from.

    Raises:
        ValueError: naming the DP defences that provide one.
    """
    if not any(isinstance(cb, PrivacyBudget) for cb in callbacks):
        return
    if not any(isinstance(p, PrivacyLedger) for p in [*callbacks, *components]):
        raise ValueError(
            "loop.callbacks has a PrivacyBudget but the run has no DP defence to account for (no privacy ledger); "
            "add FedCDP, FedSDP, PoGZNoise or DualDPFL to defences, or remove the PrivacyBudget."
        )


def check_secure_aggregation_has_company(
    aggregator: Any, client_transforms: Sequence[Any], *, clients_per_round: int
) -> None:
    """Secure aggregation (Paillier, SecAgg masks) hides one update among the others of its round; with one client a
    round the aggregate is that client's update, which every client then decrypts: it protects nothing.

    Raises:
        ValueError: naming the encryption and ``loop.clients_per_round``.

    Example:
        >>> check_secure_aggregation_has_company(None, [SecAggMasking()], clients_per_round=1)
        Traceback (most recent call last):
        ...
        ValueError: SecAggMasking aggregates one client a round (loop.clients_per_round=1), so the aggregate is that client's own update and hides nothing; set loop.clients_per_round to 2 or more, or drop the secure aggregation.
    """  # noqa: E501
    hiding = [t for t in client_transforms if isinstance(t, PaillierEncryption | SecAggMasking)]
    hiding += [aggregator] if isinstance(aggregator, SecureFedAvg) else []
    if hiding and clients_per_round < 2:
        raise ValueError(
            f"{type(hiding[0]).__name__} aggregates one client a round (loop.clients_per_round={clients_per_round}), "
            "so the aggregate is that client's own update and hides nothing; set loop.clients_per_round to 2 or "
            "more, or drop the secure aggregation."
        )


def check_composition(
    *,
    client_transforms: Sequence[Any],
    aggregator: Any,
    callbacks: Sequence[Any],
    components: Sequence[Any],
    stages: Mapping[str, Sequence[Any]] | None = None,
    clients_per_round: int | None = None,
) -> None:
    """Apply every rule of this module to a run's merged plug-ins (defence parts and the loop's own).

    ``stages`` are the merged chains by name, checked for a defence given twice
    (:func:`~lightning_fl.defences.base.check_defences_once`); ``clients_per_round`` is the run's ``K_t``.

    Raises:
        ValueError: from the first rule that fails.
    """
    check_encryption_last(client_transforms)  # names a second encryption before the general rule does
    check_defences_once(stages or {})
    if clients_per_round is not None:
        check_secure_aggregation_has_company(aggregator, client_transforms, clients_per_round=clients_per_round)
    check_secure_aggregation(aggregator, client_transforms)
    check_robust_reads_plaintext(aggregator, client_transforms)
    check_budget_has_ledger(callbacks, components)
