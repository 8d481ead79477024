"""The update-transform chain: small protocols by which DP, pruning and HE defences plug into the loop.

* :class:`ClientTransform` runs on the client after local training, on the :class:`ClientUpdate` it is about
  to send (clip, noise, prune, encrypt), with the client's :class:`~lightning_fl.contexts.ClientContext`.
  What comes out is what the server receives (the type-1 leak point).
* :class:`ServerTransform` runs on the server on the aggregate delta (server-side noise, public-data
  fine-tuning), with the round's :class:`~lightning_fl.contexts.RoundContext`. What comes out is what is
  broadcast (the type-0 leak point).
* :class:`BroadcastTransform` runs on the public global state the server sends to one client (2DP-FL's
  per-client noise on the global model).

Transforms are applied in list order. Each may keep state across rounds (an accountant) through
``state_dict``/``load_state_dict``, which the loop checkpoints, and may inspect the run once in ``setup``
(server side: a :class:`~lightning_fl.contexts.SetupContext`, no client state). A client transform also gets a
client-side set-up, ``setup_clients``, with the clients' own states (a key ceremony).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from lightning_fl.messages import ClientUpdate

if TYPE_CHECKING:
    from lightning_fl.contexts import ClientContext, ClientSetupContext, RoundContext, SetupContext

__all__ = [
    "BroadcastTransform",
    "ClientTransform",
    "ServerPlugin",
    "ServerTransform",
    "apply_server_plugins",
    "own_layers",
]


class _Stateful:
    def setup(self, ctx: SetupContext) -> None:
        """Called once before the first round with the run's shape and parts."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class ClientTransform(_Stateful, ABC):
    """Client-side: transform the update a client is about to send.

    Attributes:
        encrypts: whether what it sends is ciphertext (Paillier): nothing after it can read the encrypted layers,
            so it must end the chain.
        hides_update: whether the server cannot read the plaintext update it sends (encryption, secure aggregation
            masks), so an aggregator that compares plaintext updates cannot run with it.
    """

    encrypts: bool = False
    hides_update: bool = False

    @abstractmethod
    def __call__(self, update: ClientUpdate, *, ctx: ClientContext) -> ClientUpdate:
        """Transform and return; see the class docstring."""

    def setup_clients(self, ctx: ClientSetupContext) -> None:
        """Client side, once before the first round (after ``setup``): read or write the clients' own states, e.g.
        share a key pair or restore per-client counters. The default does nothing."""

    def decode_aggregate(self, aggregate: Any, *, ctx: ClientContext) -> Any:
        """Client-side, after aggregation: undo this transform's encoding on what the server returns.

        The loop applies it in reverse chain order to the aggregator's result, which must end as a dict of
        tensors (e.g. Paillier ciphertexts are decrypted here, by a participating client, with its own key).
        The default passes the aggregate through.
        """
        return aggregate


class ServerTransform(_Stateful, ABC):
    """Server-side: transform the aggregate delta before it is added to the global model."""

    @abstractmethod
    def __call__(self, delta: dict[str, Tensor], *, ctx: RoundContext) -> dict[str, Tensor]:
        """Transform and return; see the class docstring."""


class BroadcastTransform(_Stateful, ABC):
    """Server-side: transform the public global state sent to one client (``ctx.client_id``).

    Attributes:
        persistent: whether the change this transform makes stays in the model the client returns. If true
            (2DP-FL's downlink noise), aggregation averages the client *models*: the server measures each
            update against its own global state, ``w_k - w``, which carries the client's perturbation along.
            If false, perturbations are forgotten: updates are measured against what each client received.
    """

    persistent: bool = False

    @abstractmethod
    def __call__(self, state: dict[str, Tensor], *, ctx: RoundContext) -> dict[str, Tensor]:
        """Transform and return; ``ctx`` is the receiving client's context (use only its round and id)."""


class ServerPlugin(ABC):
    """Server-side: a change to the model the server ships and to what it broadcasts (a malicious server).

    Not a defence: it acts for the server, against the clients (Robbing the Fed's imprint,
    :class:`~lightning_fl.attacks.MaliciousImprint`). It is listed under ``server_plugins``
    (``FederatedLoop(server_plugins=[...])``, a top-level ``server_plugins:`` key of a config) and applied to the
    model before the defences (:func:`apply_server_plugins`), so that the clients' defences act on what it ships.
    """

    @abstractmethod
    def apply_to_model(self, model: nn.Module) -> nn.Module:
        """Change ``model`` in place (the architecture and weights the server ships) and return it."""

    def broadcast_transforms(self) -> list[BroadcastTransform]:
        """What it does to each model it sends (after :meth:`apply_to_model`); none by default."""
        return []

    def use_data(self, data: Any) -> None:
        """Read the settings it takes from the run's data when they were not given (the server's own held-out data:
        the data's statistics); :func:`apply_server_plugins` calls it with its ``data`` first. Default: nothing."""


def apply_server_plugins(model: nn.Module, plugins: Sequence[ServerPlugin], *, data: Any = None) -> nn.Module:
    """Apply each server plug-in to ``model`` once, in list order (with ``data``, each first reads what it takes
    from the data: :meth:`ServerPlugin.use_data`); a second call with the same plug-ins (a second loop on the same
    model) changes nothing. Returns the same model.

    Raises:
        TypeError: on an entry that is not a :class:`ServerPlugin`, or one whose ``apply_to_model`` returns
            another model.
    """
    applied = model.__dict__.setdefault("_fl_applied_server_plugins", [])
    planted = model.__dict__.setdefault("_fl_server_planted", set())
    for plugin in plugins:
        if not isinstance(plugin, ServerPlugin):
            raise TypeError(
                f"server_plugins=[..., {type(plugin).__name__}, ...] is not a ServerPlugin; defences go to defences:."
            )
        if id(plugin) in applied:
            continue
        if data is not None:
            plugin.use_data(data)
        before = {name for name, _ in model.named_modules()}
        if plugin.apply_to_model(model) is not model:
            raise TypeError(f"{type(plugin).__name__}.apply_to_model must change the model in place and return it.")
        planted.update(name for name, _ in model.named_modules() if name not in before)
        applied.append(id(plugin))
    return model


def own_layers(model: nn.Module, kind: type[nn.Module]) -> dict[str, nn.Module]:
    """The modules of type ``kind`` in ``model``, by name in registration order, without those a server plug-in
    planted (:func:`apply_server_plugins`): a malicious server's block is not a layer of the client's model, so a
    defence that looks for the classifier head (the last ``nn.Linear``) must not take it.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 2))
        >>> list(own_layers(net, nn.Linear))
        ['0']
    """
    planted = model.__dict__.get("_fl_server_planted", set())
    return {name: m for name, m in model.named_modules() if isinstance(m, kind) and name not in planted}
