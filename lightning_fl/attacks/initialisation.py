"""Starting candidates of the gradient-matching attacks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

__all__ = ["INITS", "InitName", "initial_images"]

InitName = Literal["randn", "rand", "patterned", "image_randn"]
INITS: tuple[str, ...] = ("randn", "rand", "patterned", "image_randn")


def initial_images(shape: Sequence[int], *, init: InitName, generator: torch.Generator) -> Tensor:
    """Starting candidates of ``shape`` ``(R, B, C, H, W)``, drawn on the CPU from ``generator``.

    ``randn``: N(0, 1), the DLG and inversefed choice. ``rand``: U(0, 1). ``patterned``: a 4x4 U(0, 1) patch per
    restart, image and channel tiled over the image, the "patterned random seed" of CPL (Wei et al., ESORICS 2020)
    that Fed-CDP's attack uses (Inferred: the 4x4 patch size, which the paper leaves open). ``image_randn``:
    N(1/2, 1/4^2), the N(0, 1) start of inversefed and breaching drawn in their standardised input space and mapped
    back to [0, 1] pixels (natural images have mean ~1/2 and standard deviation ~1/4 per channel).

    Example:
        >>> initial_images((2, 1, 1, 8, 8), init="patterned", generator=torch.Generator().manual_seed(0)).shape
        torch.Size([2, 1, 1, 8, 8])
    """
    if init == "randn":
        return torch.randn(*shape, generator=generator)
    if init == "image_randn":
        return 0.5 + 0.25 * torch.randn(*shape, generator=generator)
    if init == "rand":
        return torch.rand(*shape, generator=generator)
    if init == "patterned":
        *lead, height, width = shape
        patch = torch.rand(*lead, 4, 4, generator=generator)
        return patch.repeat(*([1] * len(lead)), -(-height // 4), -(-width // 4))[..., :height, :width]
    raise ValueError(f"init={init!r} is unknown; use one of {list(INITS)}.")
