"""Private state: the one mechanism by which a module keeps tensors away from the server.

A module is *private* when its attribute ``fl_private`` is true (set it with :func:`mark_private`, or as a
class attribute on a layer such as a passport or key-lock layer). Every parameter and buffer owned by a
private module, or by any of its descendants, is private. Private tensors stay in the
:class:`~lightning_fl.contexts.ClientState` between rounds and are never part of a
:class:`~lightning_fl.messages.ClientUpdate`, the global state, a log or a server checkpoint.

A private module may also define ``reset_private(generator: torch.Generator) -> None``: the client calls it
once, the first time it trains, to draw its own secrets (passports, keys) from a client-specific seed. The
global model's private modules keep the server's own initialisation, which is therefore exactly the
"fresh initialisation" an attacker has to guess with.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

__all__ = [
    "is_private_module",
    "load_state_into",
    "mark_private",
    "private_modules",
    "private_state",
    "public_state",
    "reset_private_state",
    "stateful_leaves",
    "the_normalisation_after",
]

NORMALISATIONS: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)
"""Layers that normalise their input with statistics and/or an affine map of their own (batch, instance, group and
layer norm)."""


def mark_private(module: nn.Module, private: bool = True) -> nn.Module:
    """Mark ``module`` (and everything below it) as private to the client; returns the module.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
        >>> _ = mark_private(net[0])
        >>> sorted(private_state(net))
        ['0.bias', '0.weight']
    """
    module.fl_private = private
    return module


def is_private_module(module: nn.Module) -> bool:
    """True when ``module`` itself is marked private (not looking at its parents)."""
    return bool(getattr(module, "fl_private", False))


def private_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """Yield ``(name, module)`` for each outermost private module of ``model``."""
    yield from _walk(model, prefix="")


def _walk(module: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Module]]:
    if is_private_module(module):
        yield prefix.rstrip("."), module
        return
    for name, child in module.named_children():
        yield from _walk(child, f"{prefix}{name}.")


def stateful_leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of the leaf modules that hold parameters or buffers, in registration order (the forward
    order of the models in :mod:`lightning_fl.models`); activations and pooling hold none.

    Example:
        >>> [name for name, _ in stateful_leaves(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.BatchNorm2d(2)))]
        ['0', '2']
    """
    return [
        (name, m)
        for name, m in model.named_modules()
        if not list(m.children()) and (list(m.parameters(recurse=False)) or list(m.buffers(recurse=False)))
    ]


def the_normalisation_after(model: nn.Module, name: str) -> nn.Module | None:
    """The normalisation layer (:data:`NORMALISATIONS`) that comes right after module ``name`` (the next stateful
    leaf outside it), or ``None`` when the next one is something else or there is none.

    A normalisation of a private layer's output belongs to that private layer: its running statistics and affine
    map are fitted to that client's own features, and averaging them over clients whose private layers differ
    fits no client (FDL-PP's private layers are "the first several layers", Gu et al. Sec. 2.1; FedBN keeps them
    local for the same reason).

    Example:
        >>> net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Conv2d(2, 2, 3))
        >>> the_normalisation_after(net, "0") is net[1], the_normalisation_after(net, "1")
        (True, None)
    """
    leaves = stateful_leaves(model)
    inside = [i for i, (leaf, _) in enumerate(leaves) if leaf == name or leaf.startswith(f"{name}.")]
    follower = leaves[inside[-1] + 1][1] if inside and inside[-1] + 1 < len(leaves) else None
    return follower if isinstance(follower, NORMALISATIONS) else None


def _private_prefixes(model: nn.Module) -> tuple[str, ...]:
    return tuple(f"{name}." if name else "" for name, _ in private_modules(model))


def _is_private_key(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(prefix == "" or key.startswith(prefix) for prefix in prefixes)


def public_state(model: nn.Module) -> dict[str, Tensor]:
    """The state-dict entries of ``model`` that may leave the client (detached references, not copies).

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), mark_private(nn.Linear(2, 1)))
        >>> sorted(public_state(net))
        ['0.bias', '0.weight']
    """
    prefixes = _private_prefixes(model)
    return {k: v for k, v in model.state_dict(keep_vars=False).items() if not _is_private_key(k, prefixes)}


def private_state(model: nn.Module) -> dict[str, Tensor]:
    """The state-dict entries of ``model`` that must never leave the client (detached references)."""
    prefixes = _private_prefixes(model)
    if not prefixes:
        return {}
    return {k: v for k, v in model.state_dict(keep_vars=False).items() if _is_private_key(k, prefixes)}


def reset_private_state(model: nn.Module, *, generator: torch.Generator) -> None:
    """Let every private module that defines ``reset_private(generator)`` draw its client's own secrets."""
    for _, module in private_modules(model):
        for sub in module.modules():
            reset = getattr(sub, "reset_private", None)
            if callable(reset):
                reset(generator)


def load_state_into(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Copy ``state`` into the matching entries of ``model``'s state in place (keys not given are kept).

    Example:
        >>> net = nn.Linear(1, 1)
        >>> load_state_into(net, {"bias": torch.tensor([2.0])})
        >>> net.bias.item()
        2.0
    """
    own = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for key, value in state.items():
            own[key].copy_(value)
