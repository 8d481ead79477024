"""A run's plug-ins, merged and checked: orders and combinations that would run but do something else than asked.

:func:`compose` merges the defences' parts with the loop's own plug-ins into :class:`Plugins` and applies every rule;
each rule raises one ``ValueError`` that names the plug-ins and the fix (the ``lightning-fl`` command then exits with 2
before writing anything). A defence given twice, in one list or in ``defences`` and ``loop.*``, is refused by one
rule, :func:`~lightning_fl.defences.base.check_defences_once`; the order of model defences is handled by
:func:`~lightning_fl.defences.apply_defences`.

The rules ask plug-ins for the capabilities they declare, never for their type: a client transform's ``encrypts``
(its output is ciphertext, so it must end the chain) and ``hides_update`` (the server cannot read the plaintext), an
aggregator's ``needs_encryption`` and ``reads_plaintext``, a callback's ``needs_privacy_ledger``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from torch import nn

from lightning_fl.defences.base import Defence, check_defences_once, collect_parts
from lightning_fl.privacy.accounting import PrivacyLedger
from lightning_fl.server import FedAvg, UniformSelector
from lightning_fl.transforms import ServerPlugin, apply_server_plugins

__all__ = [
    "Plugins",
    "check_budget_has_ledger",
    "check_composition",
    "check_encryption_last",
    "check_robust_reads_plaintext",
    "check_secure_aggregation",
    "check_secure_aggregation_has_company",
    "compose",
]


def _chain(transforms: Sequence[Any]) -> str:
    return "[" + ", ".join(type(t).__name__ for t in transforms) + "]"


def _declares(plugin: Any, capability: str) -> bool:
    return bool(getattr(plugin, capability, False))


def check_encryption_last(client_transforms: Sequence[Any]) -> None:
    """At most one client transform that ``encrypts``, and it ends the client chain.

    A transform after it sees an update whose encrypted layers are gone from ``delta``: noise, clipping or pruning
    there changes nothing (or only the layers sent in the clear), and a second encryption finds nothing left to
    encrypt and freezes the layers the first one encrypted.

    Raises:
        ValueError: naming the chain and the fix.

    Example:
        >>> from lightning_fl.defences import GaussianNoise, PaillierEncryption
        >>> check_encryption_last([GaussianNoise(0.1), PaillierEncryption(key_size=256, max_weight_sum=4)])
    """
    positions = [i for i, t in enumerate(client_transforms) if _declares(t, "encrypts")]
    if not positions:
        return
    name = type(client_transforms[positions[0]]).__name__
    if len(positions) > 1:
        raise ValueError(
            f"the client transforms {_chain(client_transforms)} encrypt twice ({name} at "
            f"{positions}); keep one {name} (give it in defences or loop.client_transforms, not both)."
        )
    if positions[0] != len(client_transforms) - 1:
        after = type(client_transforms[positions[0] + 1]).__name__
        raise ValueError(
            f"the client transforms {_chain(client_transforms)} run {after} after {name}, on an update "
            f"whose encrypted layers it cannot see; put {name} last (clip, noise and prune before "
            "encryption)."
        )


def check_secure_aggregation(aggregator: Any, client_transforms: Sequence[Any]) -> None:
    """An aggregator that ``needs_encryption`` (``SecureFedAvg``) needs clients that encrypt: without them it is
    plain FedAvg under a secure name.

    Raises:
        ValueError: when no client transform ``encrypts``.
    """
    if _declares(aggregator, "needs_encryption") and not any(_declares(t, "encrypts") for t in client_transforms):
        raise ValueError(
            f"loop.aggregator={type(aggregator).__name__} but no client transform encrypts, so it would average "
            "plaintext updates; add PaillierEncryption to defences (or loop.client_transforms), or use FedAvg."
        )


def check_robust_reads_plaintext(aggregator: Any, client_transforms: Sequence[Any]) -> None:
    """An aggregator that ``reads_plaintext`` (a :class:`~lightning_fl.server.RobustAggregator`) compares the
    clients' plaintext updates; a transform that ``hides_update`` (Paillier, secure aggregation masks) hides them,
    so the two cannot be combined.

    Raises:
        ValueError: naming the aggregator, the hiding transform and the two ways out.

    Example:
        >>> from lightning_fl.server import TrimmedMean
        >>> check_robust_reads_plaintext(TrimmedMean(), [])
    """
    hiding = [t for t in client_transforms if _declares(t, "hides_update")]
    if _declares(aggregator, "reads_plaintext") and hiding:
        raise ValueError(
            f"loop.aggregator={type(aggregator).__name__} compares the clients' plaintext updates, but "
            f"{type(hiding[0]).__name__} encrypts them; drop the encryption or use its own aggregator "
            "(docs/architecture.md, 'What the server checks', says which checks remain under encryption)."
        )


def check_budget_has_ledger(callbacks: Sequence[Any], components: Sequence[Any]) -> None:
    """A callback that ``needs_privacy_ledger`` (``PrivacyBudget``) needs a privacy ledger (a DP defence) to read
    the spent epsilon from.

    Raises:
        ValueError: naming the DP defences that provide one.
    """
    needing = [cb for cb in callbacks if _declares(cb, "needs_privacy_ledger")]
    if needing and not any(isinstance(p, PrivacyLedger) for p in [*callbacks, *components]):
        raise ValueError(
            f"loop.callbacks has a {type(needing[0]).__name__} but the run has no DP defence to account for (no "
            "privacy ledger); add FedCDP, FedSDP, PoGZNoise or DualDPFL to defences, or remove the "
            f"{type(needing[0]).__name__}."
        )


def check_secure_aggregation_has_company(
    aggregator: Any, client_transforms: Sequence[Any], *, clients_per_round: int
) -> None:
    """Secure aggregation (a transform that ``hides_update``, an aggregator that ``needs_encryption``) hides one
    update among the others of its round; with one client a round the aggregate is that client's update, which every
    client then decrypts: it protects nothing.

    Raises:
        ValueError: naming the plug-in and ``loop.clients_per_round``.

    Example:
        >>> from lightning_fl.defences import SecAggMasking
        >>> check_secure_aggregation_has_company(None, [SecAggMasking()], clients_per_round=1)
        Traceback (most recent call last):
        ...
        ValueError: SecAggMasking aggregates one client a round (loop.clients_per_round=1), so the aggregate is that client's own update and hides nothing; set loop.clients_per_round to 2 or more, or drop the secure aggregation.
    """  # noqa: E501
    hiding = [t for t in client_transforms if _declares(t, "hides_update")]
    hiding += [aggregator] if _declares(aggregator, "needs_encryption") else []
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


@dataclass(frozen=True)
class Plugins:
    """The plug-ins of one run, each stage's defence parts before the loop's own ones (an accountant before the
    budget that reads it).

    Args:
        server_plugins: what the server changes of the model it ships and of what it broadcasts (a malicious server).
        selector: picks each round's clients.
        aggregator: turns a round's updates into one aggregate.
        client_transforms: the client-side chain; server_transforms: the chain on the aggregate;
            broadcast_transforms: the chain on what each client receives.
        callbacks: the FL callbacks; client_callbacks: the Lightning callbacks of every client's Trainer.
    """

    server_plugins: list[Any]
    selector: Any
    aggregator: Any
    client_transforms: list[Any]
    server_transforms: list[Any]
    broadcast_transforms: list[Any]
    callbacks: list[Any]
    client_callbacks: list[Any]

    def by_stage(self) -> dict[str, Any]:
        """Each stage's plug-in or list of them, under its argument name (``aggregator``, ``client_transforms``...)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def components(self) -> list[Any]:
        """The stateful server-side parts, in checkpoint order."""
        transforms = [*self.client_transforms, *self.server_transforms, *self.broadcast_transforms]
        return [self.selector, self.aggregator, *transforms]


def compose(
    defences: Sequence[Defence],
    *,
    model: nn.Module,
    data: Any = None,
    server_plugins: Sequence[ServerPlugin] = (),
    selector: Any = None,
    aggregator: Any = None,
    client_transforms: Sequence[Any] = (),
    server_transforms: Sequence[Any] = (),
    broadcast_transforms: Sequence[Any] = (),
    callbacks: Sequence[Any] = (),
    client_callbacks: Sequence[Any] = (),
    clients_per_round: int | None = None,
) -> Plugins:
    """Apply the ``server_plugins`` and then the ``defences`` to ``model`` (each first reading what it takes from
    ``data``, the run's data module, when given) and merge their parts with the loop's own
    plug-ins (uniform selection and FedAvg when nobody sets them), then check the result (:func:`check_composition`;
    ``clients_per_round`` is the run's ``K_t``).
    The server plug-ins' broadcast transforms come first: the clients' defences act on what the server ships.

    Raises:
        ValueError: when two sources set the aggregator or the selector, or a rule of this module fails.
        TypeError: on a server plug-in that is not a :class:`~lightning_fl.transforms.ServerPlugin`.
    """
    apply_server_plugins(model, server_plugins, data=data)
    server = [t for plugin in server_plugins for t in plugin.broadcast_transforms()]
    parts = collect_parts(defences, model=model, data=data, aggregator=aggregator, selector=selector)
    plugins = Plugins(
        server_plugins=list(server_plugins),
        selector=parts.selector or UniformSelector(),
        aggregator=parts.aggregator or FedAvg(),
        client_transforms=[*parts.client_transforms, *client_transforms],
        server_transforms=[*parts.server_transforms, *server_transforms],
        broadcast_transforms=[*server, *parts.broadcast_transforms, *broadcast_transforms],
        callbacks=[*parts.callbacks, *callbacks],
        client_callbacks=[*parts.client_callbacks, *client_callbacks],
    )
    stages = ("client_transforms", "server_transforms", "broadcast_transforms", "callbacks", "client_callbacks")
    check_composition(
        client_transforms=plugins.client_transforms,
        aggregator=plugins.aggregator,
        callbacks=plugins.callbacks,
        components=plugins.components,
        stages={f"loop.{stage}": getattr(plugins, stage) for stage in stages},  # a defence's parts, then the loop's
        clients_per_round=clients_per_round,
    )
    return plugins
