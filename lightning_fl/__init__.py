"""lightning-fl: a PyTorch Lightning toolkit for privacy research in federated learning.

Federated training where every client is an ordinary Lightning Trainer, gradient-leakage attacks as
callbacks at chosen rounds, and drop-in defences, with utility and privacy measured side by side.
"""
# ruff: noqa: E402 -- the command's signal handlers come before the imports, which take seconds

from lightning_fl.cli_signals import exit_outside_the_run as _exit_outside_the_run

_exit_outside_the_run()  # the command's exit codes hold from its first line

from lightning_fl.attacks import *  # noqa: F403
from lightning_fl.attacks import __all__ as _attacks
from lightning_fl.bench import build_loop, fit_config_spec, run_bench, scratch_loop
from lightning_fl.callbacks import *  # noqa: F403
from lightning_fl.callbacks import __all__ as _callbacks
from lightning_fl.contexts import (
    ClientContext,
    ClientSetupContext,
    ClientState,
    FederationSpec,
    RoundContext,
    SetupContext,
    derive_seed,
)
from lightning_fl.datamodules import *  # noqa: F403
from lightning_fl.datamodules import __all__ as _datamodules
from lightning_fl.defences import *  # noqa: F403
from lightning_fl.defences import __all__ as _defences
from lightning_fl.federation.export import load_global_model, save_global_model
from lightning_fl.federation.failures import ClientFailure, ServerSideError
from lightning_fl.federation.loop import FederatedLoop
from lightning_fl.flower import FlowerFederation
from lightning_fl.messages import LEAK_POINTS, ClientUpdate, GroundTruth, LeakPoint, ServerView
from lightning_fl.models import *  # noqa: F403
from lightning_fl.models import __all__ as _models
from lightning_fl.privacy import *  # noqa: F403
from lightning_fl.privacy import __all__ as _privacy
from lightning_fl.private import mark_private, private_state, public_state
from lightning_fl.server import *  # noqa: F403
from lightning_fl.server import __all__ as _server
from lightning_fl.transforms import (
    BroadcastTransform,
    ClientTransform,
    ServerPlugin,
    ServerTransform,
    apply_server_plugins,
)
from lightning_fl.view import FederationView

__version__ = "0.1.0"

__all__ = [
    "LEAK_POINTS",
    "BroadcastTransform",
    "ClientContext",
    "ClientFailure",
    "ClientSetupContext",
    "ClientState",
    "ClientTransform",
    "ClientUpdate",
    "FederatedLoop",
    "FederationSpec",
    "FederationView",
    "FlowerFederation",
    "GroundTruth",
    "LeakPoint",
    "RoundContext",
    "ServerSideError",
    "ServerPlugin",
    "ServerTransform",
    "ServerView",
    "SetupContext",
    "apply_server_plugins",
    "derive_seed",
    "load_global_model",
    "mark_private",
    "private_state",
    "public_state",
    "build_loop",
    "fit_config_spec",
    "run_bench",
    "save_global_model",
    "scratch_loop",
    *_attacks,
    *_callbacks,
    *_datamodules,
    *_defences,
    *_models,
    *_privacy,
    *_server,
]
