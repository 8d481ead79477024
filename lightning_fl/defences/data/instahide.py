"""InstaHide: mix k images (private, optionally public), then flip the sign of each pixel at random.

Reference:
    Huang, Song, Li, Arora, "InstaHide: Instance-hiding Schemes for Private Distributed Learning", ICML 2020,
    Sec. 3 (inside-dataset and cross-dataset InstaHide); the coefficient draw follows GradAttack (Huang et al.,
    NeurIPS 2021), which evaluates InstaHide against gradient inversion.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from lightning_fl.defences.data.mixing import MixingDefence

__all__ = ["InstaHide", "flip_signs"]


def flip_signs(images: Tensor, *, generator: torch.Generator, center: float = 0.0) -> Tensor:
    r"""InstaHide's one-time pad: :math:`\sigma \circ (x - c) + c`, with :math:`\sigma` i.i.d. uniform on
    :math:`\{-1, +1\}` for every pixel of every image (Huang et al., ICML 2020, Sec. 3, "random sign flipping").

    Args:
        images: ``(B, ...)``.
        generator: source of the signs.
        center: the value pixels are flipped about (the paper flips zero-centred pixels: 0 for normalised inputs,
            0.5 for [0, 1] pixels).

    Example:
        >>> flipped = flip_signs(torch.full((1, 1000), 2.0), generator=torch.Generator().manual_seed(0))
        >>> sorted(flipped.unique().tolist()), abs(float(flipped.mean())) < 0.2
        ([-2.0, 2.0], True)
    """
    signs = torch.randint(0, 2, images.shape, generator=generator).to(images) * 2 - 1
    return signs * (images - center) + center


class InstaHide(MixingDefence):
    r"""InstaHide (Huang et al., ICML 2020, Sec. 3): each training image becomes
    :math:`\sigma \circ \sum_{j=1}^k \lambda_j x_j` with its soft label :math:`\sum_{j \le k_{priv}} \lambda_j
    \mathrm{onehot}(y_j)`.

    The first ``k - num_public`` slots are the example and partners from the client's private training set; the
    last ``num_public`` come from ``public_images`` (cross-dataset InstaHide) and do not count in the label. The
    weights are drawn as GradAttack does: :math:`|\mathcal N(0, 1)|` normalised to sum 1, redrawn until none
    exceeds ``max_coefficient`` (its upper bound 0.65). The sign mask :math:`\sigma` is new for every mixture.
    A Lightning callback, like :class:`~lightning_fl.defences.MixUp`.

    Args:
        k: images per mixture (the paper uses 4 and 6); 1 only flips signs.
        num_public: how many of the ``k`` come from ``public_images`` (0: inside-dataset InstaHide).
        public_images: ``(N, ...)`` public images, needed when ``num_public > 0``.
        max_coefficient: upper bound on every weight (GradAttack: 0.65); must be >= 1/k.
        center: the value pixels are flipped about (see :func:`flip_signs`).
        num_classes: width of the soft labels; ``None`` reads ``pl_module.num_classes``.
        seed: seeds the partners, weights and signs.

    Raises:
        ValueError: if ``k < 1``, ``num_public`` is outside [0, k), ``public_images`` is missing for
            ``num_public > 0``, or ``max_coefficient`` is outside [1/k, 1].

    Example:
        >>> hide = InstaHide(k=4)
        >>> weights = hide.coefficients(3, torch.Generator().manual_seed(0))
        >>> bool((weights.sum(dim=1) - 1).abs().max() < 1e-6), bool(weights.max() <= 0.65)
        (True, True)
    """

    def __init__(
        self,
        *,
        k: int = 4,
        num_public: int = 0,
        public_images: Tensor | None = None,
        max_coefficient: float = 0.65,
        center: float = 0.0,
        num_classes: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(k=k, num_classes=num_classes, seed=seed)
        if not 0 <= num_public < k:
            raise ValueError(f"InstaHide(num_public={num_public}) must be in [0, k={k}); one image must be private.")
        if num_public and (public_images is None or len(public_images) == 0):
            raise ValueError(f"InstaHide(num_public={num_public}) needs public_images, a (N, ...) tensor of images.")
        if not 1.0 / k <= max_coefficient <= 1.0:
            raise ValueError(f"InstaHide(max_coefficient={max_coefficient}) must be in [1/k, 1] = [{1 / k:.3g}, 1].")
        self.num_public, self.public_images = num_public, public_images
        self.max_coefficient, self.center = max_coefficient, center

    @override
    def coefficients(self, rows: int, generator: torch.Generator) -> Tensor:
        weights = torch.empty(rows, self.k)
        todo = torch.ones(rows, dtype=torch.bool)
        while todo.any():
            draw = torch.randn(int(todo.sum()), self.k, generator=generator).abs()
            weights[todo] = draw / draw.sum(dim=1, keepdim=True)
            todo = weights.max(dim=1).values > self.max_coefficient
        return weights

    @override
    def finish(self, mixed: Tensor, generator: torch.Generator) -> Tensor:
        return flip_signs(mixed, generator=generator, center=self.center)

    @override
    def label_mask(self) -> Tensor | None:
        return torch.tensor([1.0] * (self.k - self.num_public) + [0.0] * self.num_public)

    @override
    def partners(self, trainer: L.Trainer, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        rows, private = count // (self.k - 1), self.k - 1 - self.num_public
        slots_x, slots_y = [], []
        if private:
            inputs, labels = super().partners(trainer, rows * private, generator)
            slots_x.append(inputs.view(rows, private, *inputs.shape[1:]))
            slots_y.append(labels.view(rows, private))
        if self.num_public:
            assert self.public_images is not None  # checked in __init__
            picks = torch.randint(len(self.public_images), (rows * self.num_public,), generator=generator)
            public = self.public_images[picks]
            slots_x.append(public.view(rows, self.num_public, *public.shape[1:]))
            slots_y.append(torch.zeros(rows, self.num_public, dtype=torch.long))  # masked out of the label
        dtype = slots_x[0].dtype
        return torch.cat([x.to(dtype) for x in slots_x], 1).flatten(0, 1), torch.cat(slots_y, 1).flatten()

    def __repr__(self) -> str:
        return f"InstaHide(k={self.k}, num_public={self.num_public}, max_coefficient={self.max_coefficient})"
