r"""What a gradient-matching attacker knows of a BatchNorm network's statistics, and the prior that uses it.

A client that trains in train mode normalises each BatchNorm layer with its batch's own mean and variance. Whether
the attacker knows those statistics is a threat-model choice (Huang et al., NeurIPS 2021, "Evaluating Gradient
Inversion Attacks and Defenses in Federated Learning", Sec. 3, the "BN statistics" axis):

* ``"none"``: the attacker simulates batch statistics and knows nothing of them. With one image per batch the first
  layer's normalisation makes the gradient blind to the image's brightness and contrast.
* ``"running"``: the running statistics of the broadcast model, which the server holds (See-Through-Gradients' and
  DeepInversion's prior; informative once the model has trained).
* ``"leaked"``: the batches' own statistics. A FedSGD update shares the running-statistics buffers after one local
  step, :math:`r' = (1 - m) r + m \mu_B`, so the server reads :math:`\mu_B = r + (r' - r)/m` (and the unbiased
  variance likewise); breaching's user sends these buffers too (``provide_buffers``). After T local steps
  :math:`r_T = \prod_t (1 - m_t)\, r_0 + \sum_t a_t \mu_t` with :math:`a_t = m_t \prod_{u > t} (1 - m_u)`, so the
  server reads the weighted mean :math:`\sum_t w_t \mu_t` of the steps' batch statistics, :math:`w_t = a_t / \sum_u
  a_u`, and the attacker matches its simulated steps' statistics with the same weights.

The prior is DeepInversion's (Yin et al., CVPR 2020, Eq. 4; See-Through-Gradients, Eq. 9):
:math:`R_{BN}(x) = \sum_l \|\mu_l(x) - \mu_l\|_2 + \|\sigma^2_l(x) - \sigma^2_l\|_2`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Literal

from torch import Tensor, nn
from torch.func import replace_all_batch_norm_modules_

from lightning_fl.messages import ServerView

__all__ = [
    "BN_STATISTICS",
    "BatchNormStatistics",
    "BatchNormStatisticsName",
    "batch_norm_distance",
    "batch_norm_layer_names",
    "batch_norm_prior",
    "batch_norm_statistics",
    "batch_norm_step_weights",
    "leaked_batch_statistics",
]

BatchNormStatisticsName = Literal["none", "running", "leaked", "auto"]
BN_STATISTICS: tuple[str, ...] = ("none", "running", "leaked", "auto")
BatchNormStatistics = list[tuple[Tensor, Tensor]]
"""One ``(mean, unbiased variance)`` pair of per-channel tensors for each ``BatchNorm2d``, in model order."""


def _batch_norms(model: nn.Module) -> list[tuple[str, nn.BatchNorm2d]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d) and m.running_mean is not None]


def batch_norm_layer_names(model: nn.Module) -> list[str]:
    """The ``BatchNorm2d`` layers with running statistics whose :data:`BatchNormStatistics` an attacker matches,
    in model order."""
    return [name for name, _ in _batch_norms(model)]


def _step_shares(layer: nn.BatchNorm2d, local_steps: int) -> list[float]:
    r""":math:`a_t = m_t \prod_{u > t} (1 - m_u)`, the share of step t's batch statistics in ``layer``'s buffers."""
    tracked = int(layer.num_batches_tracked) if layer.num_batches_tracked is not None else 0
    momenta = [layer.momentum if layer.momentum is not None else 1.0 / (tracked + t + 1) for t in range(local_steps)]
    return [m * math.prod(1 - later for later in momenta[t + 1 :]) for t, m in enumerate(momenta)]


def batch_norm_step_weights(model: nn.Module, local_steps: int) -> list[list[float]]:
    r"""For each ``BatchNorm2d`` of ``model`` (in model order), the weights :math:`w_t` of the ``local_steps`` steps'
    batch statistics in its running buffers after those steps: :math:`w_t = a_t / \sum_u a_u`,
    :math:`a_t = m_t \prod_{u > t} (1 - m_u)`, with ``m_t`` the layer's momentum, or :math:`1 / (n + t + 1)` for a
    cumulative average after ``n`` tracked batches (see the module text). One step: ``[1.0]``.

    Example:
        >>> net = nn.Sequential(nn.BatchNorm2d(2), nn.BatchNorm2d(2, momentum=None))
        >>> [[round(w, 4) for w in layer] for layer in batch_norm_step_weights(net, 2)]
        [[0.4737, 0.5263], [0.5, 0.5]]
    """
    shares = [_step_shares(layer, local_steps) for _, layer in _batch_norms(model)]
    return [[share / sum(layer) for share in layer] for layer in shares]


def batch_norm_distance(
    step_inputs: Sequence[Sequence[Tensor]],
    statistics: BatchNormStatistics,
    *,
    correction: int,
    step_weights: Sequence[Sequence[float]] | None = None,
) -> Tensor:
    r""":math:`R_{BN}` of one candidate batch from the inputs each local step fed each ``BatchNorm2d``
    (``step_inputs[t][l]``, ``(B, C, H, W)``): per layer, the steps' batch means and variances (with ``correction``,
    see :func:`batch_norm_prior`) averaged with ``step_weights[l]`` (:func:`batch_norm_step_weights`; ``None``: one
    step), :math:`\sum_l \|\mu_l(x) - \mu_l\|_2 + \|\sigma^2_l(x) - \sigma^2_l\|_2`.

    Raises:
        ValueError: when the steps, layers, weights and ``statistics`` differ in length.
    """
    weights = step_weights if step_weights is not None else [[1.0]] * len(statistics)
    total = step_inputs[0][0].new_zeros(())
    per_layer = list(zip(*step_inputs, strict=True))
    for features, (mean, var), layer_weights in zip(per_layer, statistics, weights, strict=True):
        steps = list(zip(layer_weights, features, strict=True))
        batch_mean = sum(w * f.mean((0, 2, 3)) for w, f in steps)
        batch_var = sum(w * f.var((0, 2, 3), correction=correction) for w, f in steps)
        total = total + (batch_mean - mean).norm() + (batch_var - var).norm()
    return total


def leaked_batch_statistics(view: ServerView) -> BatchNormStatistics | None:
    r"""The statistics of the client's batches, read off the running-statistics change its update shares.

    Inverts :math:`r_T = \prod_t (1 - m_t)\, r_0 + \sum_t a_t s_t` for each ``BatchNorm2d`` buffer (module text):
    the batch's own mean and unbiased variance after one local step, their :func:`batch_norm_step_weights`-weighted
    mean over the steps after ``view.metadata["local_steps"]``. ``None`` when the view does not hold every buffer's
    change.

    Example:
        >>> import torch
        >>> from lightning_fl.attacks.standalone import client_view
        >>> net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(72, 3))
        >>> images = torch.rand(2, 1, 8, 8)
        >>> view = client_view(net, images, torch.tensor([0, 1]), num_classes=3)
        >>> mean, var = leaked_batch_statistics(view)[0]
        >>> features = net[0](images)
        >>> torch.allclose(mean, features.mean((0, 2, 3)), atol=1e-5)
        True
        >>> torch.allclose(var, features.var((0, 2, 3)), atol=1e-5)
        True
    """
    local_steps = int(view.metadata.get("local_steps") or 1)
    statistics: BatchNormStatistics = []
    for name, layer in _batch_norms(view.model):
        mean_key, var_key = f"{name}.running_mean", f"{name}.running_var"
        if mean_key not in view.tensors or var_key not in view.tensors:
            return None
        moved = sum(_step_shares(layer, local_steps))
        old_mean, old_var = layer.running_mean.detach(), layer.running_var.detach()
        mean = old_mean + view.tensors[mean_key].detach().to(old_mean) / moved
        var = old_var + view.tensors[var_key].detach().to(old_var) / moved
        statistics.append((mean, var))
    return statistics or None


def batch_norm_statistics(view: ServerView, choice: BatchNormStatisticsName) -> BatchNormStatistics | None:
    """The statistics the attacker's BatchNorm prior matches under threat model ``choice`` (see the module text).

    ``"auto"``: the leaked batch statistics where the view holds them, else none. ``None``: no prior (also for a
    model without ``BatchNorm2d``).

    Raises:
        ValueError: for ``"leaked"`` when the view does not hold them, naming what is missing.
    """
    if choice == "none" or not _batch_norms(view.model):
        return None
    if choice == "running":
        return [(m.running_mean.detach(), m.running_var.detach()) for _, m in _batch_norms(view.model)]
    leaked = leaked_batch_statistics(view)
    if leaked is None and choice == "leaked":
        raise ValueError(
            "bn_statistics='leaked' needs an update that shares the BatchNorm running statistics "
            f"(the {view.leak_point!r} view holds none); use 'running', 'none' or 'auto'."
        )
    return leaked


def batch_norm_prior(
    model: nn.Module, statistics: BatchNormStatistics | None = None, *, correction: int = 0
) -> Callable[[Tensor], Tensor]:
    r"""The prior :math:`R_{BN}(x)` against ``statistics`` (default: the running statistics ``model`` holds now).

    Returns a function of one candidate batch ``(B, C, H, W)`` (``vmap``-able over restarts) that runs a copy of
    ``model`` with batch statistics and sums the distances at every ``BatchNorm2d``; ``correction`` is the candidates'
    variance correction (0: biased, as DeepInversion; 1: unbiased, as the running buffers store a batch).

    Raises:
        ValueError: if ``model`` has no ``BatchNorm2d`` with running statistics, or ``statistics`` has another length.

    Example:
        >>> import torch
        >>> net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
        >>> prior = batch_norm_prior(net.eval())
        >>> float(prior(torch.zeros(2, 1, 4, 4)).detach()) > 0
        True
    """
    copied = copy.deepcopy(model).train()
    layers = [m for _, m in _batch_norms(copied)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no BatchNorm2d with running statistics: R_BN needs them.")
    if statistics is None:
        statistics = [(m.running_mean.detach().clone(), m.running_var.detach().clone()) for m in layers]
    if len(statistics) != len(layers):
        raise ValueError(f"{len(statistics)} BatchNorm statistics given for {len(layers)} BatchNorm2d layers.")
    replace_all_batch_norm_modules_(copied)  # batch statistics, no running-stat writes (vmap-safe)
    seen: list[Tensor] = []
    for layer in layers:
        layer.register_forward_pre_hook(lambda _, args: seen.append(args[0]))

    def prior(images: Tensor) -> Tensor:
        seen.clear()
        copied(images)
        total = batch_norm_distance([seen], statistics, correction=correction)
        seen.clear()
        return total

    return prior
