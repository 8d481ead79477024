"""The plug-ins' set-up before the first round: the server side sees what the server holds, the clients' side sees
the clients' own states and data.

:meth:`FederatedLoop.prepare <lightning_fl.federation.loop.FederatedLoop.prepare>` builds the two contexts with
:func:`setup_context` and :func:`client_setup_context` and hands them to :func:`set_up_plugins`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from lightning_fl.contexts import ClientSetupContext, ClientState, FederationSpec, SetupContext

if TYPE_CHECKING:
    from torch import nn

    from lightning_fl.contexts import ClientEvaluationStep
    from lightning_fl.datamodules.federated import FederatedDataModule
    from lightning_fl.federation.composition import Plugins

__all__ = ["client_setup_context", "set_up_plugins", "setup_context"]


def setup_context(
    spec: FederationSpec,
    datamodule: FederatedDataModule,
    global_model: nn.Module,
    trainer_options: dict[str, Any],
    plugins: Plugins,
    client_evaluation: ClientEvaluationStep,
) -> SetupContext:
    """What the server-side parts inspect in their ``setup``: the run's shape, the server's own test set, a copy
    of the global model, the aggregator and server chain they must match; no client's state or data."""
    return SetupContext(
        spec=spec,
        test_set=datamodule.test_set if datamodule.has_test_set else None,
        global_model=copy.deepcopy(global_model),
        trainer_options=dict(trainer_options),
        aggregator=plugins.aggregator,
        server_transforms=tuple(plugins.server_transforms),
        client_evaluation=client_evaluation,
    )


def client_setup_context(
    *, spec: FederationSpec, datamodule: FederatedDataModule, clients: Iterable[ClientState]
) -> ClientSetupContext:
    """What the plug-ins' client-side set-up (``setup_clients``) receives: the clients' own states and validation
    splits."""
    val_sets = tuple(datamodule.client_val_set(k) for k in range(spec.num_clients))
    return ClientSetupContext(spec=spec, clients=tuple(clients), val_sets=val_sets)


def set_up_plugins(components: Sequence[Any], *, setup: SetupContext, client_setup: ClientSetupContext | None) -> None:
    """Run every component's server-side ``setup`` (their configuration checks), then the client-side
    ``setup_clients`` of those that declare one (key ceremonies, checks of the clients' data); ``client_setup`` is
    ``None`` where the clients set themselves up in their own processes (a remote pool).

    Raises:
        ValueError: on a setting a component rejects.
    """
    for component in components:
        component.setup(setup)
    if client_setup is None:
        return
    for component in components:
        if hasattr(component, "setup_clients"):
            component.setup_clients(client_setup)
