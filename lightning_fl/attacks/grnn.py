"""GRNN: the Generative Regression Neural Network gradient-leakage attack (Ren, PhD thesis 2023, ch. 3).

A generator with two branches, the fake-data generator and the fake-label generator, maps one fixed latent
:math:`v \\sim \\mathcal{N}(0, 1)^{B \\times g_{in}}` to a batch of images and soft labels (Eq. 3.3). Only the
generator's weights are trained: the gradient the fake batch induces on the global model is pulled towards the
intercepted one with RMSprop (Algorithm 1, Eq. 3.4).

References:
    H. Ren, J. Deng, X. Xie, "GRNN: Generative Regression Neural Network -- A Data Leakage Attack for
    Federated Learning", ACM TIST 2022, https://doi.org/10.1145/3510032 (thesis ch. 3).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from rich.progress import Progress
from torch import Tensor, nn
from torch.func import replace_all_batch_norm_modules_

from lightning_fl.attacks.base import GradientAttack, IterationCallback, Reconstruction
from lightning_fl.attacks.gradient_matching import matching_target
from lightning_fl.attacks.local_update import simulated_pseudo_gradient
from lightning_fl.messages import ServerView

__all__ = [
    "GRNN",
    "GRNN_LOSSES",
    "GRNNGenerator",
    "GRNNLoss",
    "GRNNLossName",
    "flat_l2_distance",
    "grnn_loss",
    "total_variation_l1",
    "total_variation_squared",
    "wasserstein_1d",
]


# -- the generator (thesis Sec. 3.2.2, Fig. 3.2, Table 3.1) ----------------------------------------------------------
def _upsampling_block(in_channels: int, out_channels: int) -> nn.Sequential:
    """One upsampling block of Table 3.1: nearest x2, 3x3 conv, BatchNorm, GLU.

    The conv has ``2 * out_channels`` outputs and no bias because GLU halves the channels (authors' code).
    """
    return nn.Sequential(
        nn.Upsample(scale_factor=2, mode="nearest"),
        nn.Conv2d(in_channels, 2 * out_channels, kernel_size=3, stride=1, padding=1, bias=False),
        nn.BatchNorm2d(2 * out_channels),
        nn.GLU(dim=1),
    )


class GRNNGenerator(nn.Module):
    """The two-branch GRNN generator: images and soft labels from one shared latent (thesis Eq. 3.3).

    Image branch: a 4x4 transposed convolution (``g_in -> 2 d 2^n`` channels, GLU) then ``log2(size) - 2``
    upsampling blocks (Table 3.1) halving the width each time (``d 2^(k+1) -> d 2^k``), the last one mapping
    ``d`` to the image channels, then a sigmoid so images lie in [0, 1]. With ``d = 32`` and a 32x32 RGB target
    the channels run 128 -> 64 -> 32 -> 3 over 4x4 -> 8x8 -> 16x16 -> 32x32.
    Label branch: one linear layer and a softmax, :math:`\\hat y = \\mathrm{softmax}(W v + b)`.

    Inferred: the widths (``d = 32``, GLU after the transposed conv, bias-free convs) come from the authors'
    code; the thesis gives only Table 3.1 and the 32x32 example.

    Args:
        latent_dim: :math:`g_{in}`, the latent size (authors' code: 128).
        num_classes: classes of the attacked model (width of the label branch).
        image_shape: ``(C, H, W)`` of the images to generate; ``H == W``, a power of two >= 8.
        width: :math:`d`, the channel width of the last upsampling block (authors' code: 32).

    Raises:
        ValueError: if the image is not square with a power-of-two side of at least 8.

    Example:
        >>> gen = GRNNGenerator(latent_dim=16, num_classes=10, image_shape=(1, 16, 16))
        >>> images, labels = gen(torch.randn(2, 16))
        >>> tuple(images.shape), tuple(labels.shape), bool(labels.sum(1).allclose(torch.ones(2)))
        ((2, 1, 16, 16), (2, 10), True)
    """

    def __init__(
        self, *, latent_dim: int, num_classes: int, image_shape: tuple[int, int, int], width: int = 32
    ) -> None:
        super().__init__()
        channels, height, side = image_shape
        if height != side or side < 8 or side & (side - 1):
            raise ValueError(
                f"GRNNGenerator(image_shape={tuple(image_shape)}) needs square images whose side is a power of two "
                ">= 8 (the generator doubles a 4x4 map); resize the data (e.g. data.image_size=32)."
            )
        n = int(math.log2(side)) - 3
        top = width * 2**n
        self.image_shape = (channels, side, side)
        self.initial = nn.Sequential(nn.ConvTranspose2d(latent_dim, 2 * top, kernel_size=4, bias=False), nn.GLU(dim=1))
        blocks = [_upsampling_block(width * 2 ** (k + 1), width * 2**k) for k in reversed(range(n))]
        self.blocks = nn.Sequential(*blocks, _upsampling_block(width, channels))
        self.label_branch = nn.Linear(latent_dim, num_classes)

    def forward(self, latent: Tensor) -> tuple[Tensor, Tensor]:
        """Map ``latent`` ``(B, g_in)`` to images ``(B, C, H, W)`` in [0, 1] and soft labels ``(B, classes)``."""
        images = torch.sigmoid(self.blocks(self.initial(latent[:, :, None, None])))
        return images, F.softmax(self.label_branch(latent), dim=-1)


# -- the loss (thesis Eq. 3.4) and its two readings ------------------------------------------------------------------
def wasserstein_1d(a: Tensor, b: Tensor) -> Tensor:
    r"""Wasserstein-1 (earth mover's) distance between the value distributions of two equal-size vectors.

    The thesis' WD term (Eq. 3.4): a distance "between two gradient vectors" that captures their distribution.
    For two empirical distributions with the same number of atoms it is the mean absolute difference of the
    sorted values, :math:`W_1 = \frac1n \sum_i |a_{(i)} - b_{(i)}|`.

    Example:
        >>> wasserstein_1d(torch.tensor([0.0, 1.0, 2.0]), torch.tensor([2.0, 0.0, 1.0]))
        tensor(0.)
        >>> wasserstein_1d(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 2.0]))
        tensor(1.)
    """
    return (torch.sort(a.flatten()).values - torch.sort(b.flatten()).values).abs().mean()


def flat_l2_distance(a: Tensor, b: Tensor) -> Tensor:
    """Euclidean norm of ``a - b``: what the authors' code computes as "Wasserstein distance" of two 1-row inputs.

    Example:
        >>> flat_l2_distance(torch.tensor([0.0, 0.0]), torch.tensor([3.0, 4.0]))
        tensor(5.)
    """
    return (a - b).flatten().norm()


def total_variation_l1(images: Tensor) -> Tensor:
    """Total variation as the thesis defines it: the sum of absolute differences of adjacent pixels.

    Example:
        >>> total_variation_l1(torch.tensor([[[[0.0, 1.0], [1.0, 1.0]]]]))
        tensor(2.)
    """
    return (images[..., 1:, :] - images[..., :-1, :]).abs().sum() + (images[..., 1:] - images[..., :-1]).abs().sum()


def total_variation_squared(images: Tensor) -> Tensor:
    """The authors' code's total variation: squared differences, normalised by count, ``2 (h + w) / B``.

    Example:
        >>> total_variation_squared(torch.tensor([[[[0.0, 1.0], [1.0, 1.0]]]]))
        tensor(2.)
    """
    _, channels, height, width = images.shape
    vertical = (images[..., 1:, :] - images[..., :-1, :]).pow(2).sum() / (channels * (height - 1) * width)
    horizontal = (images[..., 1:] - images[..., :-1]).pow(2).sum() / (channels * height * (width - 1))
    return 2 * (vertical + horizontal) / images.shape[0]


GRNNLossName = Literal["wasserstein_tv_l1", "l2_tv_squared"]


class GRNNLoss(nn.Module):
    """One reading of Eq. 3.4: :math:`\\|g - \\hat g\\|^2 + \\mathrm{WD}(g, \\hat g) + \\alpha\\,\\mathrm{TV}(\\hat x)`.

    Args:
        distribution_distance: the WD term on the flat gradient vectors.
        total_variation: the TV prior on the fake images.
    """

    def __init__(
        self, distribution_distance: Callable[[Tensor, Tensor], Tensor], total_variation: Callable[[Tensor], Tensor]
    ) -> None:
        super().__init__()
        self.distribution_distance, self.total_variation = distribution_distance, total_variation

    def forward(self, *, true_grad: Tensor, fake_grad: Tensor, fake_images: Tensor, tv_weight: float) -> Tensor:
        squared_error = (fake_grad - true_grad).pow(2).sum()
        return (
            squared_error
            + self.distribution_distance(true_grad, fake_grad)
            + tv_weight * self.total_variation(fake_images)
        )

    def extra_repr(self) -> str:
        return f"wd={self.distribution_distance.__name__}, tv={self.total_variation.__name__}"


GRNN_LOSSES: dict[str, GRNNLoss] = {
    "wasserstein_tv_l1": GRNNLoss(wasserstein_1d, total_variation_l1),
    "l2_tv_squared": GRNNLoss(flat_l2_distance, total_variation_squared),
}
"""The two readings of Eq. 3.4, named for what they compute. Both use the summed squared error
as "MSE" (the thesis writes :math:`\\|g - \\hat g\\|^2`, the code sums). ``"wasserstein_tv_l1"`` (the thesis
text): WD is the true 1-D Wasserstein-1 distance between the gradient values and TV the sum of absolute pixel
differences. ``"l2_tv_squared"`` (the authors' code): "WD" is the L2 norm of the difference and TV is squared and
normalised."""


def grnn_loss(
    *,
    true_grad: Tensor,
    fake_grad: Tensor,
    fake_images: Tensor,
    tv_weight: float,
    loss: GRNNLossName = "wasserstein_tv_l1",
) -> Tensor:
    r"""The GRNN objective, Eq. 3.4 of the thesis, on flat gradient vectors.

    .. math::
        \hat{\mathcal L}(g, \hat g, \hat x) = \|g - \hat g\|^2 + \mathrm{WD}(g, \hat g) + \alpha\,\mathrm{TV}(\hat x)

    Args:
        true_grad: :math:`g`, the intercepted gradient, flattened and concatenated over layers.
        fake_grad: :math:`\hat g`, the gradient of the generated batch, same layout.
        fake_images: :math:`\hat x`, the generated images ``(B, C, H, W)``.
        tv_weight: :math:`\alpha` (thesis Sec. 3.3.1: 1e-3 for LeNet, 1e-6 for ResNet-18).
        loss: which reading of WD and TV, see :data:`GRNN_LOSSES`.

    Example:
        >>> g = torch.tensor([1.0, 2.0])
        >>> grnn_loss(true_grad=g, fake_grad=g + 1, fake_images=torch.zeros(1, 1, 2, 2), tv_weight=1e-3)
        tensor(3.)
    """
    return _loss_by_name(loss)(true_grad=true_grad, fake_grad=fake_grad, fake_images=fake_images, tv_weight=tv_weight)


def _loss_by_name(name: str) -> GRNNLoss:
    if name not in GRNN_LOSSES:
        raise ValueError(
            f"GRNN(loss={name!r}) is unknown; use one of {sorted(GRNN_LOSSES)} "
            "('wasserstein_tv_l1' = Eq. 3.4 as the text defines it, 'l2_tv_squared' = the authors' code)."
        )
    return GRNN_LOSSES[name]


# -- the attack (thesis Algorithm 1) ---------------------------------------------------------------------------------
class GRNN(GradientAttack):
    """GRNN gradient-leakage attack: train a generator until its batch reproduces the intercepted gradient.

    Implements Algorithm 1 of the thesis (ch. 3): a fixed latent ``v ~ N(0, 1)``, the two-branch
    :class:`GRNNGenerator`, the fake gradient :math:`\\hat g = \\partial L(F(\\hat x), \\hat y) / \\partial\\theta_t`
    with second-order autograd, the Eq. 3.4 loss and RMSprop on the generator's weights only. Labels are
    ``argmax`` of the soft fake labels; with ``B > 1`` the batch order is arbitrary (the averaged gradient is
    permutation invariant), so score after matching.

    Paper defaults: RMSprop lr 1e-4, momentum 0.99, TV weight 1e-3 for LeNet (1e-6 for ResNet-18) (Sec. 3.3.1).
    Inferred (authors' code): latent size 128, width 32, 1000 iterations; the thesis gives neither. Deviation: the
    default loss is the authors' code (``"l2_tv_squared"``), whose TV the thesis' weight 1e-3 was tuned for; with the
    text's summed absolute TV that weight over-smooths (docs/grnn_and_inversion.md compares the two).
    Tiny CPU recipe: 32x32 ``digits`` on the sigmoid LeNet, batch 4, 800 iterations.

    Args:
        iterations: :math:`I`, generator updates.
        lr: RMSprop learning rate :math:`\\eta`.
        momentum: RMSprop momentum.
        tv_weight: :math:`\\alpha`, weight of the total-variation prior.
        loss: reading of Eq. 3.4, ``"wasserstein_tv_l1"`` (thesis text) or ``"l2_tv_squared"`` (authors' code); see
            :data:`GRNN_LOSSES`.
        latent_dim: :math:`g_{in}`.
        width: generator width :math:`d`.
        batch_size: images to reconstruct; ``None``: all images behind the view
            (:func:`~lightning_fl.attacks.gradient_matching.leaked_batch_size`, batch size x local steps).
        seed: seed of the latent and of the generator's initialisation.
        progress_bar: show a rich progress bar.

    Raises:
        ValueError: for a non-positive ``iterations``, ``lr``, ``latent_dim``, ``width`` or ``batch_size``, a
            negative ``tv_weight``, or an unknown ``loss``.

    Example:
        >>> GRNN(iterations=500, progress_bar=False)
        GRNN(iterations=500, lr=0.0001, momentum=0.99, tv_weight=0.001, loss='l2_tv_squared', latent_dim=128, width=32)
    """

    name = "grnn"

    def __init__(
        self,
        *,
        iterations: int = 1000,
        lr: float = 1e-4,
        momentum: float = 0.99,
        tv_weight: float = 1e-3,
        loss: GRNNLossName = "l2_tv_squared",
        latent_dim: int = 128,
        width: int = 32,
        batch_size: int | None = None,
        seed: int = 0,
        progress_bar: bool = True,
    ) -> None:
        for field_name, value in (("iterations", iterations), ("lr", lr), ("latent_dim", latent_dim), ("width", width)):
            if value <= 0:
                raise ValueError(f"GRNN({field_name}={value}) must be > 0.")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"GRNN(batch_size={batch_size}) must be >= 1, or None to read it from the view.")
        if tv_weight < 0:
            raise ValueError(f"GRNN(tv_weight={tv_weight}) must be >= 0 (thesis: 1e-3 for LeNet, 1e-6 for ResNet-18).")
        self.objective = _loss_by_name(loss)
        self.iterations, self.lr, self.momentum, self.tv_weight, self.loss = iterations, lr, momentum, tv_weight, loss
        self.latent_dim, self.width, self.batch_size, self.seed = latent_dim, width, batch_size, seed
        self.progress_bar = progress_bar

    def reconstruct(self, view: ServerView, *, callback: IterationCallback | None = None) -> Reconstruction:
        """Reconstruct the batch behind ``view``: a gradient, or an update through simulated local SGD steps.

        The generator is trained on the attacked model's device; the returned images and labels are on the CPU.
        """
        start = time.perf_counter()
        target = matching_target(view)
        true_grad = torch.cat([t.flatten() for t in target.tensors])
        model = copy.deepcopy(view.model).train()
        replace_all_batch_norm_modules_(model)  # batch statistics without running-stat writes, as the client trained
        names = set(target.names)
        params = {n: p.detach() for n, p in model.named_parameters() if n in names}
        frozen = {n: p.detach() for n, p in model.named_parameters() if n not in names}
        frozen |= dict(model.named_buffers())
        batch = self.batch_size or target.num_images
        with torch.random.fork_rng(devices=[]):  # CPU draws, then moved: seed-identical on any device
            torch.manual_seed(self.seed)
            generator = GRNNGenerator(
                latent_dim=self.latent_dim,
                num_classes=_num_classes(view),
                image_shape=tuple(view.metadata["input_shape"]),
                width=self.width,
            ).to(true_grad.device, true_grad.dtype)
            latent = torch.randn(batch, self.latent_dim).to(true_grad.device, true_grad.dtype)
        optimiser = torch.optim.RMSprop(generator.parameters(), lr=self.lr, momentum=self.momentum)
        history: list[float] = []
        with Progress(disable=not self.progress_bar, transient=True) as progress:
            task = progress.add_task("grnn attack", total=self.iterations)
            for iteration in range(self.iterations):
                optimiser.zero_grad()
                images, soft_labels = generator(latent)
                fake, _ = simulated_pseudo_gradient(
                    model,
                    params,
                    frozen,
                    images,
                    soft_labels,
                    local_steps=target.local_steps,
                    lr=target.lr,
                    data_per_step=min(target.data_per_step, batch),
                )
                fake_grad = torch.cat([fake[n].flatten() for n in target.names])
                loss = self.objective(
                    true_grad=true_grad, fake_grad=fake_grad, fake_images=images, tv_weight=self.tv_weight
                )
                loss.backward()
                optimiser.step()
                history.append(loss.item())
                if callback is not None:
                    callback(iteration, history[-1])
                progress.advance(task)
        return Reconstruction(
            images=images.detach().cpu(),
            labels=soft_labels.detach().argmax(dim=1).cpu(),
            loss_history=history,
            info={"loss": self.loss, "iterations": self.iterations, "seconds": time.perf_counter() - start},
        )

    def __repr__(self) -> str:
        return (
            f"GRNN(iterations={self.iterations}, lr={self.lr}, momentum={self.momentum}, tv_weight={self.tv_weight}, "
            f"loss={self.loss!r}, latent_dim={self.latent_dim}, width={self.width})"
        )


def _num_classes(view: ServerView) -> int:
    num_classes = int(view.metadata.get("num_classes") or 0)
    if num_classes < 1:
        raise ValueError("the view has no metadata['num_classes']; GRNN's label branch needs it.")
    return num_classes
