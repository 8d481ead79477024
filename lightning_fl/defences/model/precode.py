r"""PRECODE: a variational bottleneck before the classifier head, so each shared gradient comes from a random code.

Scheliga, Mäder, Seeland, "PRECODE - A Generic Model Extension to Prevent Deep Gradient Leakage", WACV 2022,
Sec. 3 (Eq. 1-4): the features :math:`h` pass an encoder to :math:`\mu` and :math:`\sigma`, a code
:math:`z = \mu + \sigma \odot \epsilon` with :math:`\epsilon \sim \mathcal N(0, I)` is sampled, and a decoder maps it
back to the feature width before the output layer; the loss gains :math:`\beta\,\mathrm{KL}(\mathcal N(\mu,
\sigma^2) \| \mathcal N(0, I))`. An attacker who matches the gradient does not know :math:`\epsilon`.

Reference code (dAI-SY-Group/PRECODE, ``VariationalBottleneck``): code size K = 256, :math:`\beta = 10^{-3}`,
:math:`\sigma = \mathrm{softplus}(s - 5)` from the encoder's second half :math:`s`; we follow it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._C._functorch import maybe_current_level

from lightning_fl.defences.base import Defence, apply_layers
from lightning_fl.transforms import own_layers

__all__ = ["PRECODE", "VariationalBottleneck", "add_precode", "gaussian_kl"]


def gaussian_kl(mu: Tensor, sigma: Tensor) -> Tensor:
    r""":math:`\mathrm{KL}(\mathcal N(\mu, \sigma^2) \| \mathcal N(0, I)) = \tfrac12 \sum_k (\mu_k^2 + \sigma_k^2 -
    2 \log \sigma_k - 1)` per example (PRECODE Eq. 3), shape ``(B,)``.

    Example:
        >>> gaussian_kl(torch.zeros(1, 3), torch.ones(1, 3))
        tensor([0.])
    """
    return 0.5 * (mu.pow(2) + sigma.pow(2) - 2 * sigma.log() - 1).sum(dim=1)


class VariationalBottleneck(nn.Module):
    r"""PRECODE's bottleneck: encoder :math:`h \mapsto (\mu, s)`, :math:`\sigma = \mathrm{softplus}(s - 5)`, sample
    :math:`z = \mu + \sigma \odot \epsilon` in training (:math:`z = \mu` in evaluation), decoder back to the width.

    The KL term enters the loss without the training step knowing of it: a gradient hook on :math:`\mu` and
    :math:`\sigma` adds :math:`\beta\,\partial \overline{\mathrm{KL}} / \partial(\mu, \sigma)` (the batch mean, as a
    loss averaged over the batch would) to the gradient that flows through them. So any ``training_step`` whose
    loss is a batch mean trains PRECODE's objective; its logged loss leaves the KL term out (:attr:`kl` holds the
    last batch's mean). The weights are held as parameters of this module itself: the vectorised client fit,
    which stacks only ``Conv2d`` and ``Linear`` and scales by the stacked batch, leaves such a model to the Trainer.
    Inside a ``torch.func`` transform (``vmap`` refuses random draws; the optimisation attacks vmap their restarts)
    the code is the mean, :math:`z = \mu`: an attacker simulates the client with its best guess of the noise.

    Args:
        features: width of the features in and out.
        bottleneck_size: K, the code size (PRECODE: 256).
        beta: weight of the KL term (PRECODE: 1e-3).

    Example:
        >>> vb = VariationalBottleneck(8, bottleneck_size=4)
        >>> vb(torch.rand(2, 8)).shape, vb.eval()(torch.ones(1, 8)).equal(vb(torch.ones(1, 8)))
        (torch.Size([2, 8]), True)
    """

    def __init__(self, features: int, *, bottleneck_size: int = 256, beta: float = 1e-3) -> None:
        super().__init__()
        self.features, self.bottleneck_size, self.beta = features, bottleneck_size, beta
        self.encoder_weight = nn.Parameter(torch.empty(2 * bottleneck_size, features))
        self.encoder_bias = nn.Parameter(torch.empty(2 * bottleneck_size))
        self.decoder_weight = nn.Parameter(torch.empty(features, bottleneck_size))
        self.decoder_bias = nn.Parameter(torch.empty(features))
        for weight, bias in ((self.encoder_weight, self.encoder_bias), (self.decoder_weight, self.decoder_bias)):
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))  # nn.Linear's initialisation
            bound = 1 / math.sqrt(weight.shape[1])
            nn.init.uniform_(bias, -bound, bound)
        self.kl: Tensor | None = None

    def forward(self, h: Tensor) -> Tensor:
        mu, s = F.linear(h, self.encoder_weight, self.encoder_bias).chunk(2, dim=1)
        if not self.training:
            return F.linear(mu, self.decoder_weight, self.decoder_bias)
        sigma = F.softplus(s - 5)
        self.kl = gaussian_kl(mu, sigma).mean().detach()
        if torch.is_grad_enabled() and self.beta > 0:
            scale = self.beta / len(h)
            mu_now, sigma_now = mu.detach(), sigma.detach()
            mu.register_hook(lambda g: g + scale * mu_now)
            sigma.register_hook(lambda g: g + scale * (sigma_now - 1 / sigma_now))
        z = mu if maybe_current_level() is not None else mu + sigma * torch.randn_like(mu)
        return F.linear(z, self.decoder_weight, self.decoder_bias)

    def extra_repr(self) -> str:
        return f"features={self.features}, bottleneck_size={self.bottleneck_size}, beta={self.beta}"


def _check_options(bottleneck_size: int, beta: float) -> None:
    if bottleneck_size < 1:
        raise ValueError(f"PRECODE(bottleneck_size={bottleneck_size}) must be >= 1; PRECODE uses 256.")
    if not beta >= 0:
        raise ValueError(f"PRECODE(beta={beta}) must be >= 0; it weighs the KL term (PRECODE uses 1e-3).")


def add_precode(
    model: nn.Module, *, bottleneck_size: int = 256, beta: float = 1e-3, head: str | None = None
) -> nn.Module:
    """Insert a :class:`VariationalBottleneck` before the classifier head of ``model`` (in place; returns it).

    The head (the last ``nn.Linear`` of the model's own layers, :func:`~lightning_fl.transforms.own_layers`, or the one
    named ``head``) becomes ``Sequential(bottleneck, head)``.

    Raises:
        ValueError: if ``bottleneck_size < 1``, ``beta < 0``, the model has no ``nn.Linear``, ``head`` names none,
            or a bottleneck is already in place.

    Example:
        >>> net = add_precode(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), bottleneck_size=3)
        >>> type(net[1][0]).__name__, net(torch.rand(5, 4)).shape
        ('VariationalBottleneck', torch.Size([5, 2]))
    """
    _check_options(bottleneck_size, beta)
    if any(isinstance(m, VariationalBottleneck) for m in model.modules()):
        raise ValueError("the model already has a PRECODE VariationalBottleneck; apply PRECODE once.")
    linears = list(own_layers(model, nn.Linear))
    name = head if head is not None else (linears[-1] if linears else None)
    if name not in linears:
        raise ValueError(f"PRECODE(head={head!r}) names no nn.Linear of the model; choose from {linears}.")
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name)
    linear = getattr(parent, child)
    bottleneck = VariationalBottleneck(linear.in_features, bottleneck_size=bottleneck_size, beta=beta)
    setattr(parent, child, nn.Sequential(bottleneck.to(linear.weight.device), linear))
    return model


class PRECODE(Defence):
    """The defence bundle of :func:`add_precode`, for ``defences=[...]`` and YAML (Scheliga et al., WACV 2022).

    Args:
        bottleneck_size: K, the code size (strength knob with ``beta``; PRECODE: 256).
        beta: weight of the KL term (PRECODE: 1e-3).
        head: dotted name of the classifier head; ``None``: the last ``nn.Linear``.

    Raises:
        ValueError: if ``bottleneck_size < 1`` or ``beta < 0``.

    Example:
        >>> from lightning_fl.defences import apply_defences
        >>> net = apply_defences(nn.Sequential(nn.Linear(4, 2)), [PRECODE(bottleneck_size=8)])
        >>> type(net[0][0]).__name__
        'VariationalBottleneck'
    """

    model_stage = 3  # after the layers that key-lock, passport or split the front of the model

    def __init__(self, *, bottleneck_size: int = 256, beta: float = 1e-3, head: str | None = None) -> None:
        _check_options(bottleneck_size, beta)
        self.bottleneck_size, self.beta, self.head = bottleneck_size, beta, head

    def apply_to_model(self, model: nn.Module) -> nn.Module:
        return apply_layers(add_precode, model, self)

    def __repr__(self) -> str:
        return f"PRECODE(bottleneck_size={self.bottleneck_size}, beta={self.beta}, head={self.head!r})"
