"""Adaptive attacks: gradient matching that models the defence it attacks (Balunović et al., ICLR 2022).

Balunović, Dimitrov, Jovanović and Vechev frame gradient leakage as Bayesian inference: the attacker who knows the
defence :math:`\\mathcal D` maximises :math:`\\log p(\\tilde g \\mid x) + \\log p(x)`, where
:math:`\\tilde g = \\mathcal D(\\nabla_\\theta L(x, y))` is what the server receives (Sec. 3-4, Eq. 2). Each class here
is the shared :class:`~lightning_fl.attacks.gradient_matching.GradientMatchingAttack` with the defence written into
one of its hooks, never a copy of its loop:

* :class:`KnownMaskAttack` (gradient pruning): the zeros of a pruned update are the mask, and only the kept
  coordinates are matched (:meth:`~GradientMatchingAttack.target` narrowed by :func:`kept_coordinates`);
* :class:`NoiseAwareAttack` (Gaussian or Laplace noise): the posterior's data term (squared L2 under Gaussian,
  L1 under Laplace noise) over the noise and the attacker's own model error, against Inverting Gradients' image
  prior, with more restarts;
* :class:`PrivateUnknownsAttack` (FedKL key-locks, FDL-PP passports and private split): the client's private
  tensors, which the server never sees, become unknowns optimised jointly with the images
  (:meth:`~GradientMatchingAttack.unknowns`).

References:
    Balunović et al. Bayesian Framework for Gradient Leakage. ICLR 2022. https://arxiv.org/abs/2111.04706
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from lightning_fl.attacks.distances import euclidean_distance
from lightning_fl.attacks.gradient_matching import GradientMatchingAttack, MatchingTarget
from lightning_fl.attacks.inverting_gradients import InvertingGradientsAttack
from lightning_fl.messages import ServerView
from lightning_fl.presets import REQUIRED, Preset
from lightning_fl.private import private_modules

__all__ = [
    "NOISES",
    "KnownMaskAttack",
    "NoiseAwareAttack",
    "NoiseName",
    "PrivateUnknowns",
    "PrivateUnknownsAttack",
    "ScaledShift",
    "kept_coordinates",
    "l1_distance",
    "noise_aware_distance",
]

NoiseName = Literal["gaussian", "laplace"]
PrivateUnknowns = Literal["secrets", "all"]
"""Which private tensors :class:`PrivateUnknownsAttack` optimises: the ``secrets`` (the buffers a private module
draws for each client: keys, passports) or ``all`` (their parameters too: lock layers, private kernels)."""


def l1_distance(*, candidate: Sequence[Tensor], target: Sequence[Tensor]) -> Tensor:
    r"""The L1 gradient distance :math:`\sum_l \|\nabla W'_l - \nabla W_l\|_1`.

    The negative log-likelihood (up to the scale :math:`b` and a constant) of a gradient observed under i.i.d.
    Laplace noise :math:`\mathrm{Lap}(0, b)`: the Bayes-optimal data term of Balunović et al. (ICLR 2022, Sec. 4)
    for Laplacian noise.

    Example:
        >>> l1_distance(candidate=[torch.tensor([1.0, -2.0])], target=[torch.zeros(2)])
        tensor(3.)
    """
    return sum((c - t).abs().sum() for c, t in zip(candidate, target, strict=True))


NOISES: dict[str, Callable[..., Tensor]] = {"gaussian": euclidean_distance, "laplace": l1_distance}
"""The Bayes-optimal gradient distance under each noise (Balunović et al., Sec. 4): squared L2 and L1."""


def noise_aware_distance(
    *, candidate: Sequence[Tensor], target: Sequence[Tensor], noise: NoiseName, noise_scale: float, model_error: float
) -> Tensor:
    r"""The negative log-likelihood of the received gradient under the defence's noise and the attacker's model
    error, in the units of Inverting Gradients' cosine distance.

    The received gradient is :math:`\tilde g = \nabla_\theta L(x, y) + n + e` over :math:`D` coordinates: the
    defence's noise :math:`n` (i.i.d., scale :math:`s`) and the attacker's model error :math:`e`, what separates the
    simulated gradient it can reach from the received one even without noise, of per-coordinate variance
    :math:`\tau^2 = \rho \|\tilde g\|^2 / D` (a share :math:`\rho` of the gradient's energy). Balunović et al.
    (ICLR 2022, Sec. 4) give the data term for each noise; with both sources it is

    .. math::

        \text{Gaussian: } \frac{\|\nabla_\theta L(x, y) - \tilde g\|_2^2}{2 (s^2 + \tau^2)}, \qquad
        \text{Laplace: } \frac{\|\nabla_\theta L(x, y) - \tilde g\|_1}{s + \tau / \sqrt 2}

    (for Laplace noise the model error enters as the Laplace scale of its variance, :math:`\tau / \sqrt 2`,
    added to :math:`s`), returned times :math:`\rho / D`: without noise the Gaussian term is then
    :math:`\|\nabla_\theta L - \tilde g\|^2 / (2 \|\tilde g\|^2)`, which is Inverting Gradients'
    :math:`1 - \cos` for a candidate of the received gradient's norm, so the image prior keeps Inverting Gradients'
    weights. Inferred: the model-error term and its share :math:`\rho` (the paper's attacker has none).

    Example:
        >>> g = [torch.tensor([3.0, 4.0])]
        >>> noise_aware_distance(candidate=[torch.zeros(2)], target=g, noise="gaussian", noise_scale=1e-9,
        ...                      model_error=0.01)
        tensor(0.5000)
    """
    dimension = sum(t.numel() for t in target)
    energy = sum(t.pow(2).sum() for t in target)
    model_variance = model_error * energy / dimension
    if noise == "gaussian":
        spread = 2 * (noise_scale**2 + model_variance)
    else:
        spread = noise_scale + (model_variance / 2).sqrt()
    return model_error / dimension * NOISES[noise](candidate=candidate, target=target) / spread


def kept_coordinates(target: MatchingTarget) -> MatchingTarget:
    """``target`` matched only where it is non-zero: the coordinates a pruning client kept.

    Pruning (DLG's defence, Zhu et al., NeurIPS 2019, Sec. 6) sets the smallest entries of the update to exactly
    zero, so the zeros the server receives are the mask; a non-zero entry is an unpruned one. Matching the
    candidate's gradient on the kept coordinates only removes the pruned ones from the objective, which the
    non-adaptive attack fits as if they were true zeros.

    Example:
        >>> import torch
        >>> target = MatchingTarget(("w",), (torch.tensor([0.0, 2.0, 0.0]),), 1, None, 1, 1)
        >>> kept_coordinates(target).masks
        (tensor([0., 1., 0.]),)
    """
    return dataclasses.replace(target, masks=tuple((t != 0).to(t.dtype) for t in target.tensors))


class KnownMaskAttack(InvertingGradientsAttack):
    """Inverting Gradients against gradient pruning, with the pruning mask known: only kept coordinates are matched.

    Implements the adaptive attack on pruning of Balunović et al. (ICLR 2022, Sec. 5: the defence is a known,
    deterministic map of the gradient, so the attacker evaluates it on the candidate): for top-k pruning the
    candidate's gradient restricted to the kept coordinates is what the pruned one shows. Inferred: the mask is read
    from the zeros of the received update (:func:`kept_coordinates`) rather than recomputed from the candidate's
    own top-k, which is not differentiable. The arguments are those of
    :class:`~lightning_fl.attacks.inverting_gradients.InvertingGradientsAttack`.

    Example:
        >>> KnownMaskAttack(restarts=1).name
        'adaptive_pruning'
    """

    name = "adaptive_pruning"

    def target(self, view: ServerView) -> MatchingTarget:
        """The view's pseudo-gradient, masked to the coordinates the client kept."""
        return kept_coordinates(super().target(view))


class NoiseAwareAttack(GradientMatchingAttack):
    r"""The maximum a posteriori attack on a gradient with additive Gaussian or Laplace noise of a known scale.

    Implements Eq. (2) and Sec. 4 of Balunović et al. (ICLR 2022): the attacker who knows the defence minimises
    :math:`-\log p(\tilde g \mid x) - \log p(x)` over the images, where :math:`\tilde g` is the received
    pseudo-gradient with i.i.d. noise of scale :math:`s` on every coordinate. The likelihood is
    :func:`noise_aware_distance`: squared L2 over :math:`2 (s^2 + \tau^2)` for Gaussian noise
    :math:`\mathcal N(0, s^2)`, L1 over :math:`s + \tau/\sqrt 2` for Laplace noise :math:`\mathrm{Lap}(0, s)`, where
    :math:`\tau^2` is the attacker's own model error (a share ``model_error`` of the received gradient's energy per
    coordinate), scaled so that without noise it is Inverting Gradients' cosine term. The log prior is Inverting
    Gradients' (total variation, and on a BatchNorm net the BatchNorm prior) at Inverting Gradients' weights:

    .. math::

        \min_{x \in [0,1]^n}\ \frac{\rho}{D} \cdot
            \frac{\|\nabla_\theta L(x, y) - \tilde g\|_2^2}{2 (s^2 + \tau^2)}
            + \lambda\,TV(x) + \beta\,R_{BN}(x), \qquad \tau^2 = \rho\,\|\tilde g\|^2 / D.

    Noise small against the gradient (:math:`D s^2 \ll \rho \|\tilde g\|^2`) leaves Inverting Gradients' balance of
    data and prior; noise of the gradient's size weighs the data term down by :math:`1 + D s^2 / (\rho
    \|\tilde g\|^2)` against the prior, as the posterior does. The rest is Inverting Gradients' optimiser (signed
    Adam, [0, 1] box, step decay, labels inferred first), with more restarts than its preset since the noisy
    objective has more poor local minima. Inferred: total variation (and the BatchNorm prior) stand for the paper's
    image prior; the model-error term; ``noise_scale`` is the noise on the *pseudo-gradient* (the update divided by
    the client's learning rate), which for :class:`~lightning_fl.defences.GaussianNoise` (``unit="gradient"``) at one
    local step is its ``noise_std``.

    Args:
        noise: ``"gaussian"`` or ``"laplace"`` (see :data:`NOISES`).
        noise_scale: :math:`s`, the Gaussian standard deviation or the Laplace scale; must be > 0.
        prior_weight: :math:`\lambda`, the weight of the total-variation log prior, in Inverting Gradients' units
            (its ``tv_weight``); must be >= 0.
        model_error: :math:`\rho`, the attacker's model error as a share of the received gradient's energy; must be
            > 0.
        max_iterations: Adam steps per restart.
        lr: Adam step size before decay.
        restarts: random starts run together; the best final objective wins.
        label_strategy: rule of :func:`~lightning_fl.attacks.labels.infer_labels`.
        init: starting images.
        layers: ``fnmatch`` patterns of matched parameters; ``None``: all.
        bn_statistics: the BatchNorm statistics the attacker matches (see :class:`GradientMatchingAttack`); on a
            BatchNorm net, those a FedSGD update leaks (``"auto"``), read through the same noise as the gradient.
        bn_weight: :math:`\beta`, weight of that BatchNorm prior, in Inverting Gradients' units (0 disables).
        consensus: return the mean of the restarts' best iterates (see :class:`GradientMatchingAttack`).
        progress_bar: show a rich progress bar.
        seed: seed of the starting images.

    Raises:
        ValueError: on an unknown noise, a non-positive scale or model error, or a negative prior weight.

    Example:
        >>> attack = NoiseAwareAttack(noise="gaussian", noise_scale=0.01, prior_weight=2.0)
        >>> attack.gradient_distance().keywords, attack.tv_weight
        ({'noise': 'gaussian', 'noise_scale': 0.01, 'model_error': 0.01}, 2.0)
        >>> NoiseAwareAttack(noise_scale=0.01, bn_statistics="auto", bn_weight=0.3).bn_statistics
        'auto'
    """

    name = "noise_aware"
    preset = Preset(
        pinned={
            "distance": "euclidean",
            "optimizer": "adam",
            "labels": "infer",
            "signed": True,
            "boxed": True,
            "lr_decay": True,
        },
        defaults={
            "noise": "gaussian",
            "noise_scale": REQUIRED,
            "prior_weight": 1e-4,
            "model_error": 0.01,
            "max_iterations": 4800,
            "lr": 0.1,
            "restarts": 8,
            "label_strategy": "bias_count",
            "init": "randn",
            "layers": None,
            "bn_statistics": "none",
            "bn_weight": 0.0,
            "consensus": False,
            "progress_bar": True,
            "seed": 0,
        },
    )

    def _configure(
        self, *, noise: NoiseName, noise_scale: float, prior_weight: float, model_error: float, **settings: Any
    ) -> None:
        """Check and keep the noise model; the prior keeps Inverting Gradients' weight (the class docstring)."""
        if noise not in NOISES:
            raise ValueError(f"NoiseAwareAttack(noise={noise!r}) is unknown; use one of {sorted(NOISES)}.")
        if noise_scale <= 0 or prior_weight < 0 or model_error <= 0:
            raise ValueError(
                f"NoiseAwareAttack(noise_scale={noise_scale}, prior_weight={prior_weight}, model_error={model_error}): "
                "the scale must be > 0 (the defence's sigma or Laplace b), the prior weight >= 0 and the model "
                "error > 0 (a share of the gradient's energy, e.g. 0.01)."
            )
        self.noise, self.noise_scale, self.prior_weight = noise, noise_scale, prior_weight
        self.model_error = model_error
        super()._configure(tv_weight=prior_weight, **settings)

    def gradient_distance(self) -> Callable[..., Tensor]:
        """The noise's negative log-likelihood with the model error (:func:`noise_aware_distance`)."""
        return partial(
            noise_aware_distance, noise=self.noise, noise_scale=self.noise_scale, model_error=self.model_error
        )

    def __repr__(self) -> str:
        return (
            f"NoiseAwareAttack(noise={self.noise!r}, noise_scale={self.noise_scale}, prior_weight={self.prior_weight}, "
            f"model_error={self.model_error}, max_iterations={self.max_iterations}, restarts={self.restarts})"
        )


class ScaledShift(nn.Module):
    r"""A parametrisation :math:`w = w_0 + s\,u` of a tensor around its starting value :math:`w_0` (``u = 0`` there).

    Adam moves every coordinate of its variable by about its step size, whatever the gradient's scale; optimising
    :math:`u` instead of :math:`w` makes one step move :math:`w` by about ``scale`` (a share of the tensor's own
    magnitude), so image and unknown steps can share one optimiser.

    Example:
        >>> import torch
        >>> shift = ScaledShift(torch.tensor([1.0, 2.0]), scale=0.5)
        >>> shift(torch.tensor([2.0, 0.0])), shift.right_inverse(torch.tensor([1.0, 2.0]))
        (tensor([2., 2.]), tensor([0., 0.]))
    """

    def __init__(self, start: Tensor, *, scale: float) -> None:
        super().__init__()
        self.register_buffer("start", start.detach().clone())
        self.scale = scale

    def forward(self, u: Tensor) -> Tensor:
        return self.start + self.scale * u

    def right_inverse(self, value: Tensor) -> Tensor:
        return (value - self.start) / self.scale


class PrivateUnknownsAttack(InvertingGradientsAttack):
    """Inverting Gradients with the client's private tensors as unknowns, optimised jointly with the images.

    Implements the adaptive attack on secret-parameter defences in the sense of Balunović et al. (ICLR 2022,
    Sec. 5: model what the defence hides as a latent variable and optimise it with the input): FedKL's key-lock
    (the key and the lock layers, Ren's thesis ch. 5), FDL-PP's passport layers (passports, private kernel and
    autoencoder, Gu et al. Eq. 4-5) and FDL-PP's private split (the private first layers). The server's model holds
    its own initialisation of the private modules, drawn from the distribution the client's secrets come from (the
    attacker's own random keys): the unknowns start there, and the image and unknown steps share one Adam.

    The unknowns are, with ``private="secrets"``, the floating-point buffers that the private modules
    (:func:`~lightning_fl.private.private_modules`) draw for each client in ``reset_private`` (FedKL's key, FDL-PP's
    passports), the only private values that differ from the server's copy before a client trains; with
    ``private="all"`` every private parameter and buffer (lock layers, passport kernels and autoencoders after local
    training, the split's private layers). Each restart optimises its own estimate of them (a restart is one
    joint hypothesis of images and secrets), in units of ``private_step`` times its mean magnitude
    (:class:`ScaledShift`). Through the split the server matches only the public layers' gradient, which fixes the
    features at the cut; an image follows from them only through the unknown private layers. Inferred: unknowns are
    not regularised (the secrets' distributions are broad: U[0, 1) keys, U(-1, 1) passports).

    Args:
        private: which private tensors are unknowns (see :data:`PrivateUnknowns`).
        private_step: an Adam step of size ``lr`` moves each unknown by about ``lr * private_step`` times its mean
            magnitude; must be > 0.
        **options: the arguments of :class:`~lightning_fl.attacks.inverting_gradients.InvertingGradientsAttack`.

    Raises:
        ValueError: if ``private_step`` is not positive.

    Example:
        >>> from lightning_fl.defences import PrivateSplit, apply_defences
        >>> net = apply_defences(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 2)), [PrivateSplit()])
        >>> sorted(PrivateUnknownsAttack(private="all", restarts=1).unknowns(net))
        ['0.parametrizations.bias.original', '0.parametrizations.weight.original']
    """

    name = "private_unknowns"
    preset = InvertingGradientsAttack.preset.derive(
        pinned={"signed": True, "boxed": True, "lr_decay": True},
        defaults={"private": "secrets", "private_step": 0.1},
    )

    def _configure(self, *, private: PrivateUnknowns, private_step: float, **settings: Any) -> None:
        """Check and keep which private tensors are unknowns and their step; the rest goes to the engine."""
        if private not in ("secrets", "all") or private_step <= 0:
            raise ValueError(
                f"PrivateUnknownsAttack(private={private!r}, private_step={private_step}): use 'secrets' or 'all', "
                "and a step > 0."
            )
        self.private, self.private_step = private, private_step
        super()._configure(**settings)

    def unknowns(self, model: nn.Module) -> dict[str, Tensor]:
        """Reparametrise the chosen floating-point tensors of ``model``'s private modules as :class:`ScaledShift`
        around their values and return the shifts (zero leaves), keyed by their new state-dict names.

        Raises:
            ValueError: when ``model`` has no such private tensor (the defence hides nothing to optimise).
        """
        found = [
            (".".join(part for part in (prefix, name) if part), tensor)
            for prefix, module in private_modules(model)
            for name, tensor in self._private_tensors(module)
            if tensor.is_floating_point()
        ]
        if not found:
            raise ValueError(
                f"{type(self).__name__}(private={self.private!r}): {type(model).__name__} has no private tensor of "
                "that kind; use private='all' for a private split, or apply the defence (KeyLocks, Passports) first."
            )
        unknown = {}
        for name, tensor in found:
            owner_name, _, attribute = name.rpartition(".")
            owner = model.get_submodule(owner_name)
            scale = self.private_step * max(float(tensor.detach().abs().mean()), 1e-3)
            parametrize.register_parametrization(owner, attribute, ScaledShift(tensor, scale=scale), unsafe=True)
            prefix = f"{owner_name}." if owner_name else ""
            unknown[f"{prefix}parametrizations.{attribute}.original"] = torch.zeros_like(tensor)
        return unknown

    def _private_tensors(self, module: nn.Module) -> list[tuple[str, Tensor]]:
        """``secrets``: the buffers of the submodules that draw a client's own values (``reset_private``); ``all``:
        every parameter and buffer."""
        if self.private == "all":
            return [*module.named_parameters(), *module.named_buffers()]
        return [
            (".".join(part for part in (name, buffer) if part), tensor)
            for name, sub in module.named_modules()
            if callable(getattr(sub, "reset_private", None))
            for buffer, tensor in sub.named_buffers(recurse=False)
        ]
