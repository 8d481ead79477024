r"""FDL-PP passport layers: a private convolution whose scale and shift come from secret passports.

Implements Eq. (4)-(5) of FDL-PP (Gu et al., "A novel approach to simultaneously improve privacy, efficiency
and reliability of federated DNN learning"): a passport layer after a private convolution,

.. math::

    O^l(X_c) = \gamma^l (W_p^l * X_c^l) + \beta^l, \qquad
    \gamma^l = D(E(W_p^l * P_\gamma^l)), \quad \beta^l = D(E(W_p^l * P_\beta^l)),

where :math:`P_\gamma, P_\beta` are secret passports and :math:`E, D` a small fully connected autoencoder.
The whole layer (kernel, autoencoder, passports) is private to the client (see :mod:`lightning_fl.private`):
it is never uploaded or aggregated, and each client draws its own passports from its secret seed.

References:
    FDL-PP: Gu et al., "A novel approach to simultaneously improve privacy, efficiency and reliability of
    federated DNN learning". Passports: Fan et al., "Rethinking deep neural
    network ownership verification: embedding passports to defeat ambiguity attacks", NeurIPS 2019.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_fl.defences.base import Defence, apply_layers
from lightning_fl.private import mark_private, the_normalisation_after

__all__ = ["PassportConv2d", "PassportDistribution", "PassportReduction", "Passports", "add_passports"]

PassportDistribution = Literal["uniform", "normal"]
"""How passports are drawn: ``uniform`` = U(-1, 1), ``normal`` = N(0, 1)."""

_DISTRIBUTIONS: tuple[str, ...] = ("uniform", "normal")

PassportReduction = Literal["mean", "normalized_mean"]
"""How the map :math:`W_p * P` becomes one value per channel: ``mean`` over space (Fan et al. 2019),
or ``normalized_mean``: that mean divided by its root mean square over channels (see :class:`PassportConv2d`)."""

_REDUCTIONS: tuple[str, ...] = ("mean", "normalized_mean")
_EPS = 1e-12


def _draw_passport(shape: tuple[int, ...], dist: str, generator: torch.Generator | None) -> Tensor:
    if dist == "uniform":
        return torch.rand(shape, generator=generator) * 2.0 - 1.0
    return torch.randn(shape, generator=generator)


class PassportConv2d(nn.Module):
    r"""A private convolution followed by a passport layer (FDL-PP Eq. 4-5); a drop-in for ``nn.Conv2d``.

    The layer is private (``fl_private = True``): its kernel :math:`W_p`, autoencoder :math:`E, D` and passports
    :math:`P_\gamma, P_\beta` stay on the client. :meth:`reset_private` draws the client's own passports; the
    kernel and autoencoder start from the common (server) initialisation and then train locally.

    Inferred: Eq. (5) gives no reduction from the feature map :math:`W_p * P` to a per-channel
    scale; as in Fan et al. (2019) we average it over space (and over the passport batch), giving shape
    ``(C_out,)``. Deviation (default ``reduction="normalized_mean"``): that mean is divided by its root mean
    square over channels. With U(-1, 1) passports of 32x32 pixels the spatial mean is ~0.01, so
    :math:`\gamma \approx 0.005` and a network without a normalisation after the layer (the sigmoid LeNet)
    does not train (docs/defences.md gives the accuracies); ``reduction="mean"`` is the literal Fan et al. /
    reference form.

    Inferred: :math:`E` = ``Linear(C_out, hidden)`` then LeakyReLU, :math:`D` =
    ``Linear(hidden, C_out)``, both without bias, the same pair for :math:`\gamma` and :math:`\beta` (Eq. 5 uses
    one :math:`E, D`). Inferred: passports are drawn once per client, i.i.d. from
    ``passport_dist``, with ``passport_size`` x ``passport_size`` pixels and the layer's input channels, and are
    fixed for the whole run. Deviation: the convolution has no bias of its own; :math:`\beta` is the bias.

    Args:
        in_channels: input channels :math:`C_{in}`.
        out_channels: output channels :math:`C_{out}` (the length of :math:`\gamma, \beta`).
        kernel_size: square kernel side.
        stride: convolution stride.
        padding: convolution zero padding.
        hidden_features: width of the autoencoder's code; ``None`` means ``max(1, out_channels // 4)``.
        passport_size: side length of the passports in pixels; it must be at least ``kernel_size``.
        passport_dist: distribution the passports are drawn from (see :data:`PassportDistribution`).
        reduction: how :math:`W_p * P` becomes one value per channel (see :data:`PassportReduction`).

    Raises:
        ValueError: for a non-positive size, an unknown ``passport_dist`` or ``reduction``, or a passport
            smaller than the kernel.

    Example:
        >>> layer = PassportConv2d(1, 12, 5, stride=2, padding=2)
        >>> layer(torch.rand(2, 1, 32, 32)).shape
        torch.Size([2, 12, 16, 16])
        >>> before = layer.scale_and_shift()[0].clone()
        >>> layer.reset_private(torch.Generator().manual_seed(1))
        >>> bool(torch.allclose(before, layer.scale_and_shift()[0]))
        False
    """

    fl_private = True
    per_example_unit = True
    """Per-example gradients (DP-SGD, :class:`~lightning_fl.defences.PerExampleDP`) treat the layer as one function
    of the example: its scale and shift come from the batch-free passports, which Opacus' per-layer hooks cannot
    split."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        padding: int = 0,
        hidden_features: int | None = None,
        passport_size: int = 32,
        passport_dist: PassportDistribution = "uniform",
        reduction: PassportReduction = "normalized_mean",
    ) -> None:
        super().__init__()
        hidden = max(1, out_channels // 4) if hidden_features is None else hidden_features
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels), ("hidden_features", hidden)):
            if value < 1:
                raise ValueError(f"PassportConv2d({name}={value}) must be >= 1.")
        if passport_dist not in _DISTRIBUTIONS:
            raise ValueError(
                f"PassportConv2d(passport_dist={passport_dist!r}) is unknown; use one of {_DISTRIBUTIONS}."
            )
        if reduction not in _REDUCTIONS:
            raise ValueError(f"PassportConv2d(reduction={reduction!r}) is unknown; use one of {_REDUCTIONS}.")
        if passport_size + 2 * padding < kernel_size:
            raise ValueError(
                f"PassportConv2d(passport_size={passport_size}) is smaller than the kernel ({kernel_size}); "
                "use passport_size >= kernel_size."
            )
        self.passport_dist, self.reduction = passport_dist, reduction
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False)
        self.encoder = nn.Linear(out_channels, hidden, bias=False)
        self.decoder = nn.Linear(hidden, out_channels, bias=False)
        shape = (1, in_channels, passport_size, passport_size)
        self.register_buffer("passport_gamma", _draw_passport(shape, passport_dist, None))
        self.register_buffer("passport_beta", _draw_passport(shape, passport_dist, None))

    @classmethod
    def from_conv(
        cls,
        conv: nn.Conv2d,
        *,
        hidden_features: int | None = None,
        passport_size: int = 32,
        passport_dist: PassportDistribution = "uniform",
        reduction: PassportReduction = "normalized_mean",
    ) -> PassportConv2d:
        """A passport layer that starts from ``conv``'s kernel (its bias is dropped: :math:`\\beta` replaces it).

        Raises:
            ValueError: for a grouped, dilated, non-square or string-padded convolution.
        """
        k, s, p = conv.kernel_size, conv.stride, conv.padding
        if conv.groups != 1 or conv.dilation != (1, 1) or isinstance(p, str) or k[0] != k[1] or s[0] != s[1]:
            raise ValueError(
                f"PassportConv2d.from_conv supports square, ungrouped, undilated convolutions; got {conv}."
            )
        layer = cls(
            conv.in_channels,
            conv.out_channels,
            k[0],
            stride=s[0],
            padding=p[0],
            hidden_features=hidden_features,
            passport_size=passport_size,
            passport_dist=passport_dist,
            reduction=reduction,
        ).to(conv.weight.device)
        with torch.no_grad():
            layer.conv.weight.copy_(conv.weight)
        return layer

    def reset_private(self, generator: torch.Generator) -> None:
        """Draw this client's secret passports :math:`P_\\gamma, P_\\beta` from ``generator``."""
        with torch.no_grad():
            for buffer in (self.passport_gamma, self.passport_beta):
                buffer.copy_(_draw_passport(tuple(buffer.shape), self.passport_dist, generator).to(buffer.device))

    def _affine(self, passport: Tensor) -> Tensor:
        # Eq. (5): D(E(W_p * P)), with the feature map W_p * P averaged over space and passport batch (A7-3).
        code = self.conv(passport).mean(dim=(0, 2, 3))
        if self.reduction == "normalized_mean":
            code = code / code.pow(2).mean().add(_EPS).sqrt()
        return self.decoder(F.leaky_relu(self.encoder(code)))

    def scale_and_shift(self) -> tuple[Tensor, Tensor]:
        """:math:`(\\gamma, \\beta)` of Eq. (5), each of shape ``(C_out,)``."""
        return self._affine(self.passport_gamma), self._affine(self.passport_beta)

    def forward(self, x: Tensor) -> Tensor:
        gamma, beta = self.scale_and_shift()
        return gamma.view(1, -1, 1, 1) * self.conv(x) + beta.view(1, -1, 1, 1)


def _leading_convs(model: nn.Module, count: int) -> list[tuple[str, nn.Conv2d]]:
    convs = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    if count < 1 or count > len(convs):
        raise ValueError(f"num_convs={count} must be between 1 and the model's {len(convs)} convolutions.")
    return convs[:count]


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def add_passports(
    model: nn.Module,
    *,
    num_convs: int = 1,
    hidden_features: int | None = None,
    passport_size: int = 32,
    passport_dist: PassportDistribution = "uniform",
    reduction: PassportReduction = "normalized_mean",
) -> nn.Module:
    """Retrofit FDL-PP: turn the first ``num_convs`` convolutions of ``model`` into private passport layers.

    A normalisation right after a passport layer (a conv-BatchNorm block) becomes private with it
    (:func:`~lightning_fl.private.the_normalisation_after`): it normalises the client's own features, and FDL-PP
    keeps "the first several layers" private, not a convolution without its normalisation.

    FDL-PP puts one passport layer in AlexNet's private first layer and one in each of LeNet's three
    convolutions ("three layers ... separately", paper Sec. 3): ``num_convs=1`` and ``3``. Convolutions are
    counted in registration order (``model.named_modules()``), which is the forward order of the models in
    :mod:`lightning_fl.models`. The model is changed in place and returned.

    Args:
        model: any module, e.g. an :class:`~lightning_fl.models.ImageClassifier`.
        num_convs: how many leading convolutions become passport layers.
        hidden_features: autoencoder code width (see :class:`PassportConv2d`).
        passport_size: passport side length in pixels.
        passport_dist: passport distribution.
        reduction: per-channel reduction of :math:`W_p * P` (see :data:`PassportReduction`).

    Raises:
        ValueError: if ``model`` has fewer than ``num_convs`` convolutions.

    Example:
        >>> from lightning_fl.models import LeNetDLG
        >>> from lightning_fl.private import private_state
        >>> net = add_passports(LeNetDLG(in_channels=1), num_convs=1)
        >>> sorted(private_state(net))[:3]
        ['body.0.conv.weight', 'body.0.decoder.weight', 'body.0.encoder.weight']
    """
    for name, conv in _leading_convs(model, num_convs):
        layer = PassportConv2d.from_conv(
            conv,
            hidden_features=hidden_features,
            passport_size=passport_size,
            passport_dist=passport_dist,
            reduction=reduction,
        )
        _replace(model, name, layer)
        norm = the_normalisation_after(model, name)
        if norm is not None:  # it normalises the client's own features: part of the private layer
            mark_private(norm)
    return model


class Passports(Defence):
    """FDL-PP as a model defence: ``Passports(num_convs=1).apply_to_model(model)`` calls :func:`add_passports`.

    Put it in ``loop.defences`` (or the top-level ``defences:`` of a YAML config) to retrofit any model.

    Args:
        num_convs: how many leading convolutions become private passport layers (1 for AlexNet, 3 for LeNet in
            the paper).
        hidden_features: autoencoder code width; ``None`` means a quarter of the channels.
        passport_size: passport side length in pixels.
        passport_dist: passport distribution, ``uniform`` U(-1, 1) or ``normal`` N(0, 1).
        reduction: per-channel reduction of :math:`W_p * P`, ``normalized_mean`` or the literal ``mean``.
    """

    model_stage = 1  # replaces a convolution: after key-lock, which locks the normalisation that follows it

    def __init__(
        self,
        num_convs: int = 1,
        *,
        hidden_features: int | None = None,
        passport_size: int = 32,
        passport_dist: PassportDistribution = "uniform",
        reduction: PassportReduction = "normalized_mean",
    ) -> None:
        self.num_convs, self.hidden_features = num_convs, hidden_features
        self.passport_size, self.passport_dist, self.reduction = passport_size, passport_dist, reduction

    def apply_to_model(self, model: nn.Module) -> nn.Module:
        return apply_layers(add_passports, model, self)

    def __repr__(self) -> str:
        return f"Passports(num_convs={self.num_convs}, passport_dist={self.passport_dist!r})"
