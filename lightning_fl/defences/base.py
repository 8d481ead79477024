"""Defence bundles: one object per defence, declaring what it adds at each stage of a federated run.

A defence often acts at several places at once: Fed-CDP adds a DP optimiser to every client's Trainer and an
accountant to the run; 2DP-FL adds client DP-SGD and noise on the broadcast, with one shared sigma; key-lock
adds private layers to the model. A :class:`Defence` declares all its parts, owns the values they share, and
goes into one list: ``FederatedLoop(defences=[...])``, the top-level ``defences:`` key of a YAML config (for any
model, applied after it is built), or :func:`apply_defences` for a plain Lightning project.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

if TYPE_CHECKING:
    import lightning as L

    from lightning_fl.callbacks.base import FederatedCallback
    from lightning_fl.server.aggregation import Aggregator
    from lightning_fl.server.selection import ClientSelector
    from lightning_fl.transforms import BroadcastTransform, ClientTransform, ServerTransform

__all__ = ["Defence", "DefenceParts", "apply_defences", "apply_layers", "check_defences_once", "collect_parts"]


@dataclass
class DefenceParts:
    """What a defence contributes, stage by stage (all optional).

    Args:
        client_callbacks: Lightning callbacks in every client's Trainer (per-example DP, private fine-tuning).
        callbacks: federated callbacks (accountants that follow the rounds).
        client_transforms: the client-side chain on each update (clip, noise, encrypt).
        server_transforms: the server-side chain on the aggregate (server noise, public fine-tuning).
        broadcast_transforms: the chain on the state sent to each client (downlink noise).
        aggregator: the aggregation rule this defence needs (at most one defence may set it).
        selector: the client selection this defence needs (at most one defence may set it).
    """

    client_callbacks: list[L.Callback] = field(default_factory=list)
    callbacks: list[FederatedCallback] = field(default_factory=list)
    client_transforms: list[ClientTransform] = field(default_factory=list)
    server_transforms: list[ServerTransform] = field(default_factory=list)
    broadcast_transforms: list[BroadcastTransform] = field(default_factory=list)
    aggregator: Aggregator | None = None
    selector: ClientSelector | None = None


class Defence:
    """Base class of defence bundles; override :meth:`apply_to_model` and/or :meth:`parts`.

    Subclasses hold their options (and the values their parts share, such as sigma or keys) and are chosen in
    YAML with ``class_path``/``init_args``.

    Attributes:
        model_stage: when :func:`apply_defences` applies this defence's layers, lower first, whatever the list
            order: a defence that changes the layers around a convolution (key-lock: the normalisation after
            it, stage 0) comes before one that replaces the convolution itself (passports, stage 1), and one
            that marks whole layers private (private split, stage 2) comes last, so any order of the list gives
            one architecture.
    """

    model_stage: ClassVar[int] = 0

    def apply_to_model(self, model: nn.Module) -> nn.Module:
        """Change ``model`` in place (add private layers, passports, key-locks) and return it. Default: no change."""
        return model

    def use_data(self, data: Any) -> None:
        """Read the settings this defence takes from the run's data when they were not given (the data's
        statistics); :func:`apply_defences` calls it with its ``data`` before :meth:`apply_to_model`, as the loop and
        the command do. Default: nothing."""

    def parts(self) -> DefenceParts:
        """The callbacks, transforms, aggregator and selector this defence adds to a federated run."""
        return DefenceParts()

    def check_model(self, model: nn.Module) -> None:
        """Raise a ``ValueError`` naming the layer and the fix if this defence cannot train ``model`` (the model with
        every defence's layers in place); called when the run is built, before any training. Default: any model."""


def apply_layers(add_layers: Callable[..., nn.Module], model: nn.Module, bundle: Defence) -> nn.Module:
    """``add_layers(model, **options)``, each keyword option of ``add_layers`` read from ``bundle``'s attribute of the
    same name: how a model defence's bundle (key-locks, passports, PRECODE, a private split) applies its layer
    function with the options it stores under their own names.

    Example:
        >>> from lightning_fl.defences.model.split import split_private
        >>> from lightning_fl.private import is_private_module
        >>> class FirstConvPrivate(Defence):
        ...     cut = 1
        >>> net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Conv2d(2, 2, 3))
        >>> [is_private_module(layer) for layer in apply_layers(split_private, net, FirstConvPrivate())]
        [True, False]
    """
    keywords = [p.name for p in inspect.signature(add_layers).parameters.values() if p.kind is p.KEYWORD_ONLY]
    return add_layers(model, **{name: getattr(bundle, name) for name in keywords})


def apply_defences(model: nn.Module, defences: Sequence[Defence], *, data: Any = None) -> nn.Module:
    """Apply the model layers of ``defences`` to ``model`` by :attr:`Defence.model_stage`; returns the same model.

    With ``data`` (the run's data module), each defence first reads what it takes from the data
    (:meth:`Defence.use_data`).

    The stage, not the list order, decides (the sort is stable): ``[Passports(), KeyLocks()]`` and
    ``[KeyLocks(), Passports()]`` both give a passport convolution followed by a key-locked normalisation. For a
    plain Lightning project: ``apply_defences(my_module, [KeyLocks()])``, then train it with any Trainer plus the
    client callbacks of :meth:`Defence.parts` (for example :class:`PerExampleDP`).

    Raises:
        TypeError: if an entry is not a :class:`Defence`.
        ValueError: if a defence is listed twice (two key-locks would lock the block twice), or cannot train the
            defended model (:meth:`Defence.check_model`: DP-SGD through a BatchNorm).

    Example:
        >>> from lightning_fl.defences import KeyLocks
        >>> net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        >>> type(apply_defences(net, [KeyLocks(key_length=8)])[1]).__name__
        'KeyLockNorm2d'
    """
    _check_bundles(defences)
    if data is not None:
        for defence in defences:
            defence.use_data(data)
    applied = model.__dict__.setdefault("_fl_applied_defences", [])  # a second loop on the same model: no re-apply
    for defence in sorted(defences, key=lambda d: d.model_stage):
        if id(defence) in applied:
            continue
        returned = defence.apply_to_model(model)
        if returned is not model:
            raise TypeError(f"{type(defence).__name__}.apply_to_model must change the model in place and return it.")
        applied.append(id(defence))
    for defence in defences:
        defence.check_model(model)
    return model


def _check_bundles(defences: Sequence[Defence]) -> None:
    """Every entry is a :class:`Defence`, and no class is listed twice (:func:`check_defences_once`)."""
    for defence in defences:
        if not isinstance(defence, Defence):
            raise TypeError(
                f"defences=[..., {type(defence).__name__}, ...] is not a Defence; pass Defence bundles (Passports, "
                "KeyLocks, FedCDP, ...). Plain callbacks and transforms go to loop.callbacks / loop.*_transforms."
            )
    check_defences_once({"defences": defences})


def _is_defence(part: Any) -> bool:
    """A defence bundle, or a part of one (a transform or callback defined in :mod:`lightning_fl.defences`)."""
    return isinstance(part, Defence) or type(part).__module__.startswith("lightning_fl.defences.")


def check_defences_once(stages: Mapping[str, Sequence[Any]]) -> None:
    """The one rule for a defence given twice: no defence class appears twice in one stage.

    ``stages`` maps a name to its list: the ``defences`` list itself, or a run's merged chains (a defence's own parts
    first, then the loop's), so a defence listed twice, or given in ``defences`` and again in ``loop.*`` (FedSDP in
    ``defences`` and in ``loop.client_transforms``), is refused: applied twice, it would stack a second copy of its
    layers or noise (and spend its privacy budget twice) while the run reports one.

    Raises:
        ValueError: naming the stage, the class and the two positions.

    Example:
        >>> from lightning_fl.defences import GaussianNoise
        >>> check_defences_once({"defences": [GaussianNoise(0.1), GaussianNoise(0.2)]})
        Traceback (most recent call last):
        ...
        ValueError: defences[1]=GaussianNoise repeats defences[0]; list each defence once, in defences or in loop.*, not both (set its options there): applied twice, GaussianNoise would stack a second copy of its layers or noise.
    """  # noqa: E501
    for where, parts in stages.items():
        first: dict[type, int] = {}
        for index, part in enumerate(parts):
            if not _is_defence(part):
                continue
            if type(part) in first:
                name = type(part).__name__
                raise ValueError(
                    f"{where}[{index}]={name} repeats {where}[{first[type(part)]}]; list each defence once, in "
                    "defences or in loop.*, not both (set its options there): applied twice, "
                    f"{name} would stack a second copy of its layers or noise."
                )
            first[type(part)] = index


def collect_parts(
    defences: Sequence[Defence], *, model: nn.Module, data: Any = None, aggregator: Any = None, selector: Any = None
) -> DefenceParts:
    """Apply ``defences`` to ``model`` (reading ``data``, see :func:`apply_defences`) and merge their parts; the
    loop's own aggregator/selector conflict raises.

    Raises:
        ValueError: if two sources set the aggregator (or the selector).
    """
    apply_defences(model, defences, data=data)
    merged = DefenceParts(aggregator=aggregator, selector=selector)
    for defence in defences:
        parts = defence.parts()
        for name in ("client_callbacks", "callbacks", "client_transforms", "server_transforms", "broadcast_transforms"):
            getattr(merged, name).extend(getattr(parts, name))
        for name in ("aggregator", "selector"):
            mine = getattr(parts, name)
            if mine is not None and getattr(merged, name) is not None:
                raise ValueError(
                    f"{type(defence).__name__} sets the {name}, but loop.{name} (or another defence) already does; "
                    f"remove one of them."
                )
            if mine is not None:
                setattr(merged, name, mine)
    return merged
