"""DPFL: PoGZ layer importance and per-layer Laplace noise with the budget split by importance.

Zhu, Liu, Li, Yang, Xia, Lu, "A Fine-grained Differentially Private Federated Learning against Leakage from
Gradients", IEEE Internet of Things Journal 2021 (DOI 10.1109/JIOT.2021.3131258), called DPFL here.
Each client measures PoGZ, the share of positive pre-activation outputs of every layer on its validation
data (Eq. 1), splits its budget epsilon over the layers in proportion (Eq. 3), clips its update in L1 (Eq. 2)
and adds Laplace noise of scale Delta f / epsilon_i to layer i (Eq. 4).

The paper's formula quirks are named options: ``sensitivity="two_eta_alpha"`` uses
:math:`\\Delta f = 2\\eta\\alpha` as Theorem 1 states, ``"two_alpha"`` the sound :math:`2\\alpha` for an update
clipped to L1 norm alpha; ``allocation="pogz"`` is Eq. 3 as written (more budget, so less noise, to layers
with a higher PoGZ), although the contribution list says the opposite (``"inverse"``); ``clipping="whole_update"``
is Eq. 2 (one L1 bound alpha on the whole update, so every layer's sensitivity is bounded by the same alpha, as
Theorem 1's proof states), ``"per_layer"`` gives each layer its own share of alpha (in proportion to its number of
parameters) and so its own, smaller sensitivity. The paper's forms are the defaults.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_fl.defences.base import Defence, DefenceParts
from lightning_fl.messages import ClientUpdate
from lightning_fl.privacy.accounting import PrivacyLedger
from lightning_fl.privacy.clipping import clip_state
from lightning_fl.privacy.mechanisms import laplace_noise
from lightning_fl.transforms import ClientTransform
from lightning_fl.validation import check_positive

if TYPE_CHECKING:
    from lightning_fl.contexts import ClientContext, ClientSetupContext, FederationSpec

__all__ = [
    "ALLOCATIONS",
    "CLIPPINGS",
    "Allocation",
    "Clipping",
    "PoGZNoise",
    "allocate_budget",
    "dpfl_noisy_update",
    "layer_clip_bounds",
    "pogz_laplace_noise",
    "pogz_scores",
]

Allocation = Literal["pogz", "even", "inverse"]
SensitivityMode = Literal["two_eta_alpha", "two_alpha"]
Clipping = Literal["whole_update", "per_layer"]
CLIPPINGS = ("whole_update", "per_layer")

ALLOCATIONS = {
    "pogz": lambda scores: list(scores),
    "even": lambda scores: [1.0] * len(scores),
    "inverse": lambda scores: [1.0 / s for s in scores],
}
"""Weights of the budget split from the PoGZ scores: DPFL (Eq. 3), the even baseline, and the reversed ablation."""


def _parametrised_layers(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if next(m.parameters(recurse=False), None) is not None}


@torch.no_grad()
def pogz_scores(model: nn.Module, batches: Iterable[Any]) -> dict[str, float]:
    r"""PoGZ of every layer: the share of its outputs that are greater than zero on the given data.

    Implements Eq. (1) of DPFL (Zhu et al., IEEE IoT-J 2021):

    .. math:: \mathrm{PoGZ}^{(i)} = \frac{1}{N M}\sum_{p=1}^{N}\sum_{j=1}^{M} f\big(O^{(i)}_j(p) > 0\big)

    where :math:`O^{(i)}(p)` is the output of layer i *before* its activation for sample p. Inferred:
    a layer is a module that owns parameters directly (conv, linear, ...); its forward output is the
    pre-activation, and the last linear layer's output is the logits.

    Args:
        model: the client's (pre-)trained local model; evaluated in eval mode, then restored.
        batches: validation batches, each ``(inputs, targets)`` or ``inputs``.

    Returns:
        ``{layer_name: PoGZ}`` in module order.

    Raises:
        ValueError: if ``batches`` is empty.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Sigmoid(), nn.Linear(2, 1))
        >>> _ = net[0].weight.data.copy_(torch.eye(2)), net[0].bias.data.zero_()
        >>> scores = pogz_scores(net, [torch.tensor([[1.0, -1.0], [2.0, 3.0]])])
        >>> scores["0"]
        0.75
    """
    layers = _parametrised_layers(model)
    counts = dict.fromkeys(layers, 0)
    totals = dict.fromkeys(layers, 0)

    def hook(name: str):
        def count(module: nn.Module, inputs: Any, output: Tensor) -> None:
            counts[name] += int((output > 0).sum())
            totals[name] += output.numel()

        return count

    handles = [module.register_forward_hook(hook(name)) for name, module in layers.items()]
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            model(batch[0] if isinstance(batch, list | tuple) else batch)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if not any(totals.values()):
        raise ValueError("pogz_scores got no batches; give the client's validation data (data.val_fraction > 0).")
    return {name: counts[name] / totals[name] for name in layers}


def allocate_budget(*, weights: Sequence[float], epsilon: float) -> list[float]:
    r"""Split the budget ``epsilon`` over layers in proportion to ``weights``.

    Implements Eq. (3) of DPFL: :math:`\epsilon_i = \frac{w_i}{\sum_j w_j}\,\epsilon` with
    :math:`w_i = \mathrm{PoGZ}^{(i)}`; ``weights=[1] * L`` is the paper's even baseline (Table II "wo").

    Raises:
        ValueError: if ``epsilon`` or any weight is not positive.

    Example:
        >>> allocate_budget(weights=[0.5, 0.25, 0.25], epsilon=2.0)
        [1.0, 0.5, 0.5]
    """
    if epsilon <= 0:
        raise ValueError(f"epsilon={epsilon} must be > 0.")
    if not weights or min(weights) <= 0:
        raise ValueError(
            f"allocate_budget needs positive weights, got {list(weights)}; a layer with PoGZ 0 would get no budget "
            "(infinite noise): use allocation='even' or more validation data."
        )
    total = float(sum(weights))
    return [w / total * epsilon for w in weights]


def _layer_of(key: str, layers: Sequence[str]) -> str:
    matches = [name for name in layers if key.startswith(f"{name}.") or name == ""]
    if not matches:
        raise KeyError(f"parameter {key!r} belongs to none of the layers {list(layers)}.")
    return max(matches, key=len)


def pogz_laplace_noise(
    delta: dict[str, Tensor],
    *,
    layer_epsilons: dict[str, float],
    sensitivity: float | dict[str, float],
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    r"""Add Laplace noise :math:`\mathrm{Lap}(\Delta f/\epsilon_i)` to every parameter of layer i.

    Implements Eq. (4) of DPFL: :math:`\hat{\nabla g}^{(i)} = \nabla g^{(i)} + \mathrm{Lap}(\Delta f/\epsilon_i)`,
    i.i.d. per coordinate; weight and bias of one layer share its :math:`\epsilon_i`.

    Args:
        delta: the clipped update, keyed by parameter name (``layer.weight``).
        layer_epsilons: :math:`\epsilon_i` per layer name.
        sensitivity: :math:`\Delta f`, one for every layer (the paper) or one per layer name (:math:`\Delta f_i`).
        generator: random source.

    Example:
        >>> noisy = pogz_laplace_noise({"fc.weight": torch.zeros(4)}, layer_epsilons={"fc": 1.0}, sensitivity=0.0)
        >>> noisy["fc.weight"]
        tensor([0., 0., 0., 0.])
    """
    layers = list(layer_epsilons)

    def scale(layer: str) -> float:
        return (sensitivity[layer] if isinstance(sensitivity, dict) else sensitivity) / layer_epsilons[layer]

    return {
        key: value + laplace_noise(value, scale=scale(_layer_of(key, layers)), generator=generator)
        for key, value in delta.items()
    }


def layer_clip_bounds(delta: dict[str, Tensor], layers: Sequence[str], *, clip_bound: float) -> dict[str, float]:
    r"""Per-layer L1 bounds :math:`\alpha_i = \alpha\, n_i / n` (``clipping="per_layer"``): alpha split by layer size.

    :math:`n_i` is the number of update coordinates of layer i and :math:`n` of all layers, so
    :math:`\sum_i \alpha_i = \alpha`: an update with every layer inside its :math:`\alpha_i` also satisfies Eq. (2),
    and layer i's sensitivity in Theorem 1's per-layer proof becomes :math:`2\eta\alpha_i` instead of
    :math:`2\eta\alpha`. Not in the paper (which uses one alpha); the split does not depend on the client's data.

    Example:
        >>> layer_clip_bounds({"a.weight": torch.zeros(3), "a.bias": torch.zeros(1), "b.weight": torch.zeros(4)},
        ...                   ["a", "b"], clip_bound=2.0)
        {'a': 1.0, 'b': 1.0}
    """
    sizes = dict.fromkeys(layers, 0)
    for key, value in delta.items():
        sizes[_layer_of(key, layers)] += value.numel()
    total = sum(sizes.values())
    return {layer: clip_bound * n / total for layer, n in sizes.items()}


def dpfl_noisy_update(
    delta: dict[str, Tensor],
    *,
    scores: dict[str, float],
    epsilon: float,
    clip_bound: float,
    sensitivity: float,
    allocation: Allocation = "pogz",
    clipping: Clipping = "whole_update",
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    r"""DPFL's noisy upload (Alg. 2, lines 8-13): L1 clip (Eq. 2), split epsilon (Eq. 3), per-layer Laplace (Eq. 4).

    Args:
        delta: the client's update, keyed by parameter name.
        scores: PoGZ per layer (:func:`pogz_scores`); layers without parameters in ``delta`` are ignored.
        epsilon: the upload's budget.
        clip_bound: L1 bound :math:`\alpha`.
        sensitivity: :math:`\Delta f` for the bound alpha (:math:`2\eta\alpha` in the paper).
        allocation: ``pogz``, ``even`` or ``inverse`` (see :data:`ALLOCATIONS`).
        clipping: ``whole_update`` (Eq. 2: the whole update to alpha, every layer noised for sensitivity
            :math:`\Delta f`) or ``per_layer`` (layer i to :math:`\alpha_i` of :func:`layer_clip_bounds`, noised for
            :math:`\Delta f \cdot \alpha_i / \alpha`).
        generator: random source.

    Example:
        >>> noisy = dpfl_noisy_update({"fc.weight": torch.tensor([3.0, -1.0])}, scores={"fc": 0.5}, epsilon=1.0,
        ...                           clip_bound=2.0, sensitivity=0.0)
        >>> noisy["fc.weight"]
        tensor([ 1.5000, -0.5000])
    """
    if clipping not in CLIPPINGS:
        raise ValueError(f"clipping={clipping!r} is unknown; use one of {list(CLIPPINGS)}.")
    used = {k: v for k, v in scores.items() if any(key.startswith(f"{k}.") for key in delta)}
    budgets = allocate_budget(weights=ALLOCATIONS[allocation](list(used.values())), epsilon=epsilon)
    if clipping == "whole_update":
        clipped, layer_sensitivity = clip_state(delta, max_norm=clip_bound, p=1.0), sensitivity
    else:
        bounds = layer_clip_bounds(delta, list(used), clip_bound=clip_bound)
        clipped = {}
        for layer, bound in bounds.items():
            part = {k: v for k, v in delta.items() if _layer_of(k, list(used)) == layer}
            clipped |= clip_state(part, max_norm=bound, p=1.0)
        layer_sensitivity = {layer: sensitivity * bound / clip_bound for layer, bound in bounds.items()}
    return pogz_laplace_noise(
        clipped,
        layer_epsilons=dict(zip(used, budgets, strict=True)),
        sensitivity=layer_sensitivity,
        generator=generator,
    )


class PoGZNoise(PrivacyLedger, ClientTransform, Defence):
    r"""DPFL's noisy upload (Alg. 2, lines 8-13): L1 clip, then per-layer Laplace noise split by PoGZ.

    Each client computes PoGZ once, on its validation split, with its model right after its first local fit
    (Inferred: that first fit is the pre-training; the scores are kept in ``ClientState.extra``, on the
    client only). Each upload is epsilon-DP (Theorem 1). Deviation: the paper does not compose over rounds;
    the loop's history logs ``epsilon_round`` (the paper's number) and ``epsilon``, the cumulative epsilon of
    the client that has uploaded most often (sequential composition, participations times epsilon).

    Args:
        epsilon: per-upload budget :math:`\epsilon` of each client (paper: 0.5, 1, 5, 10).
        clip_bound: L1 clip bound :math:`\alpha` of the whole update (not reported in the paper).
        allocation: ``pogz`` (Eq. 3), ``even`` (baseline) or ``inverse`` (ablation).
        sensitivity: ``two_eta_alpha`` (:math:`2\eta\alpha`, Theorem 1 as printed) or ``two_alpha``
            (:math:`2\alpha`, the sensitivity of an update clipped to L1 norm alpha).
        lr: :math:`\eta` of the ``two_eta_alpha`` sensitivity; ``None`` takes the client's learning rate from
            the update.
        clipping: ``whole_update`` (Eq. 2, one bound alpha for the update) or ``per_layer`` (layer i clipped to
            :math:`\alpha n_i / n` with its own sensitivity; not the paper's, see :func:`layer_clip_bounds`).

    Raises:
        ValueError: on a non-positive epsilon or clip bound, or an unknown option.
    """

    extra_pogz, extra_uploads = "dpfl_pogz", "dpfl_uploads"

    def __init__(
        self,
        *,
        epsilon: float = 1.0,
        clip_bound: float = 10.0,
        allocation: Allocation = "pogz",
        sensitivity: SensitivityMode = "two_eta_alpha",
        lr: float | None = None,
        clipping: Clipping = "whole_update",
    ) -> None:
        check_positive(epsilon, owner="PoGZNoise", name="epsilon")
        check_positive(clip_bound, owner="PoGZNoise", name="clip_bound", hint="; it is the L1 bound alpha of Eq. 2")
        if allocation not in ALLOCATIONS:
            raise ValueError(f"PoGZNoise(allocation={allocation!r}) is unknown; use one of {sorted(ALLOCATIONS)}.")
        if sensitivity not in ("two_eta_alpha", "two_alpha"):
            raise ValueError(f"PoGZNoise(sensitivity={sensitivity!r}) is unknown; use 'two_eta_alpha' or 'two_alpha'.")
        if clipping not in CLIPPINGS:
            raise ValueError(f"PoGZNoise(clipping={clipping!r}) is unknown; use one of {list(CLIPPINGS)}.")
        self.epsilon, self.clip_bound, self.allocation = epsilon, clip_bound, allocation
        self.sensitivity_mode, self.lr, self.clipping = sensitivity, lr, clipping
        self._uploads: dict[int, int] = {}

    @override
    def setup_clients(self, ctx: ClientSetupContext) -> None:
        self._uploads = {c.client_id: int(c.extra.get(self.extra_uploads, 0)) for c in ctx.clients}

    def sensitivity(self, lr: float | None) -> float:
        r""":math:`\Delta f`: :math:`2\eta\alpha` (``two_eta_alpha``) or :math:`2\alpha` (``two_alpha``)."""
        if self.sensitivity_mode == "two_alpha":
            return 2.0 * self.clip_bound
        eta = self.lr if self.lr is not None else lr
        if eta is None:
            raise ValueError(
                "PoGZNoise(sensitivity='two_eta_alpha') needs the learning rate eta: set PoGZNoise(lr=...)."
            )
        return 2.0 * eta * self.clip_bound

    @override
    def parts(self) -> DefenceParts:
        return DefenceParts(client_transforms=[self])

    @override
    def __call__(self, update: ClientUpdate, *, ctx: ClientContext) -> ClientUpdate:
        client = ctx.state
        if self.extra_pogz not in client.extra:  # ctx.model holds this client's weights right after its fit
            client.extra[self.extra_pogz] = pogz_scores(ctx.model, ctx.val_dataloader())
        noisy = dpfl_noisy_update(
            update.delta,
            scores=client.extra[self.extra_pogz],
            epsilon=self.epsilon,
            clip_bound=self.clip_bound,
            sensitivity=self.sensitivity(update.metadata.get("lr")),
            allocation=self.allocation,
            clipping=self.clipping,
            generator=ctx.rng("dpfl", update.client_id),
        )
        self._uploads[update.client_id] = self._uploads.get(update.client_id, 0) + 1
        client.extra[self.extra_uploads] = self._uploads[update.client_id]
        ctx.log_metrics({"epsilon_round": self.epsilon, "epsilon": self.epsilon_spent()})
        return replace(update, delta=noisy, metadata={**update.metadata, "clip_bound": self.clip_bound})

    @override
    def epsilon_spent(self) -> float:
        return self.epsilon * max(self._uploads.values(), default=0)

    @override
    def epsilon_projected(self, spec: FederationSpec) -> float:
        return self.epsilon_spent() + self.epsilon
