"""lightning-fl: a PyTorch Lightning toolkit for privacy research in federated learning.

Federated training where every client is an ordinary Lightning Trainer, gradient-leakage attacks as
callbacks at chosen rounds, and drop-in defences, with utility and privacy measured side by side.
"""
# ruff: noqa: E402 -- the command's signal handlers come before the imports, which take seconds

from lightning_fl.cli_signals import exit_outside_the_run as _exit_outside_the_run

_exit_outside_the_run()  # the command's exit codes hold from its first line

import importlib
from typing import Any

_NAMED = {
    "build_loop": "lightning_fl.bench",
    "fit_config_spec": "lightning_fl.bench",
    "run_bench": "lightning_fl.bench",
    "scratch_loop": "lightning_fl.bench",
    **dict.fromkeys(
        ["ClientContext", "ClientSetupContext", "ClientState", "FederationSpec", "RoundContext", "SetupContext"],
        "lightning_fl.contexts",
    ),
    "derive_seed": "lightning_fl.contexts",
    "load_global_model": "lightning_fl.federation.export",
    "save_global_model": "lightning_fl.federation.export",
    "ClientFailure": "lightning_fl.federation.failures",
    "ServerSideError": "lightning_fl.federation.failures",
    "FederatedLoop": "lightning_fl.federation.loop",
    "FederationView": "lightning_fl.view",
    "FlowerFederation": "lightning_fl.flower",
    **dict.fromkeys(["LEAK_POINTS", "ClientUpdate", "GroundTruth", "LeakPoint", "ServerView"], "lightning_fl.messages"),
    **dict.fromkeys(["mark_private", "private_state", "public_state"], "lightning_fl.private"),
    **dict.fromkeys(
        [
            "BroadcastTransform",
            "ClientTransform",
            "ServerPlugin",
            "ServerTransform",
            "apply_server_plugins",
            "own_layers",
        ],
        "lightning_fl.transforms",
    ),
}
"""Public names defined outside the subpackages below, and the module that defines each."""

_SUBPACKAGES = ("attacks", "callbacks", "datamodules", "defences", "models", "privacy", "server")
"""Subpackages whose whole ``__all__`` the package re-exports."""

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562), so that ``lightning-fl --help`` and ``--version`` need neither
    torch nor Lightning; ``from lightning_fl import FederatedLoop`` reads as before."""
    if name == "__all__":
        names = [*_NAMED, *(n for p in _SUBPACKAGES for n in importlib.import_module(f"lightning_fl.{p}").__all__)]
        globals()["__all__"] = names
        return names
    module = _NAMED.get(name)
    if module is None:
        module = next(
            (f"lightning_fl.{p}" for p in _SUBPACKAGES if name in importlib.import_module(f"lightning_fl.{p}").__all__),
            None,
        )
    if module is None:
        raise AttributeError(f"module 'lightning_fl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__getattr__("__all__")})
