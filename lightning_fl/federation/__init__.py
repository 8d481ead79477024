"""The federation: the loop (orchestration only) and its parts; the contexts plug-ins receive are re-exported
from :mod:`lightning_fl.contexts`.

The loop, its parts and the re-exported contexts are imported on first use, so a context does not import the loop.
"""

from importlib import import_module
from typing import Any

from lightning_fl.federation.failures import ClientFailure, ServerSideError

_LAZY = {
    "ClientContext": "lightning_fl.contexts",
    "ClientSetupContext": "lightning_fl.contexts",
    "ClientState": "lightning_fl.contexts",
    "FederationSpec": "lightning_fl.contexts",
    "RoundContext": "lightning_fl.contexts",
    "SetupContext": "lightning_fl.contexts",
    "derive_seed": "lightning_fl.contexts",
    "FederatedLoop": "lightning_fl.federation.loop",
    "ClientRunner": "lightning_fl.federation.client_runner",
    "ClientFit": "lightning_fl.federation.client_store",
    "ClientStore": "lightning_fl.federation.client_store",
    "Round": "lightning_fl.federation.round",
    "RoundResult": "lightning_fl.federation.round",
    "RoundLoop": "lightning_fl.federation.round_loop",
    "RoundReport": "lightning_fl.view",
    "Checkpoint": "lightning_fl.federation.checkpoint",
    "Evaluator": "lightning_fl.federation.evaluation",
    "LeakPoints": "lightning_fl.federation.leak_points",
    "LocalGradientSource": "lightning_fl.federation.leak_points",
    "RankPool": "lightning_fl.federation.distributed",
    "RunRecorder": "lightning_fl.federation.recording",
    "RunLock": "lightning_fl.federation.run_lock",
    "federation_fingerprint": "lightning_fl.federation.fingerprint",
    "plugin_settings": "lightning_fl.federation.fingerprint",
    "trainer_settings": "lightning_fl.federation.fingerprint",
    "payload_error": "lightning_fl.federation.updates",
    "check_composition": "lightning_fl.federation.composition",
    "WorkerPool": "lightning_fl.federation.workers",
    "VectorisedClients": "lightning_fl.federation.vectorised_clients",
    "vectorised_refusal": "lightning_fl.federation.vectorised_contract",
    "FederationView": "lightning_fl.view",
    "check_model": "lightning_fl.federation.model_contract",
    "split_batch": "lightning_fl.federation.model_contract",
    "RoundWandbLogger": "lightning_fl.federation.wandb_logger",
    "plot_curves": "lightning_fl.federation.plots",
    "load_global_model": "lightning_fl.federation.export",
    "save_global_model": "lightning_fl.federation.export",
}

__all__ = [
    "Checkpoint",
    "ClientContext",
    "ClientFailure",
    "ClientFit",
    "ClientRunner",
    "ClientSetupContext",
    "ClientState",
    "ClientStore",
    "Evaluator",
    "FederatedLoop",
    "FederationSpec",
    "FederationView",
    "LeakPoints",
    "LocalGradientSource",
    "RankPool",
    "Round",
    "RoundContext",
    "RoundLoop",
    "RoundReport",
    "RoundResult",
    "RoundWandbLogger",
    "RunLock",
    "RunRecorder",
    "ServerSideError",
    "SetupContext",
    "VectorisedClients",
    "WorkerPool",
    "check_composition",
    "check_model",
    "derive_seed",
    "federation_fingerprint",
    "load_global_model",
    "payload_error",
    "plot_curves",
    "plugin_settings",
    "save_global_model",
    "split_batch",
    "trainer_settings",
    "vectorised_refusal",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lightning_fl.federation' has no attribute {name!r}")
