"""What the ``"auto"`` settings of a gradient-matching attack resolve to, by the number of images per gradient.

One image per gradient keeps the DLG paper's objective (no prior) with an early stop; a batch (B > 1) gets a
total-variation prior, no early stop and the DLG paper's budget. The measurements behind each value are in
docs/attacks.md ("Batch recovery", "Parity").
"""

from __future__ import annotations

from typing import Literal, NamedTuple

__all__ = [
    "BATCH_MAX_ITERATIONS",
    "BATCH_TV_WEIGHT",
    "SINGLE_MAX_ITERATIONS",
    "SINGLE_STOP_BELOW",
    "Auto",
    "BatchSettings",
    "resolve_batch_settings",
]

Auto = Literal["auto"]

BATCH_TV_WEIGHT = 1e-3
"""``tv_weight="auto"`` on a batch of images (B > 1): the total-variation weight :math:`\\alpha`."""
SINGLE_MAX_ITERATIONS = 3000
"""``max_iterations="auto"`` on one image, where the early stop usually ends the run first."""
BATCH_MAX_ITERATIONS = 6000
"""``max_iterations="auto"`` on a batch, which runs without an early stop: the DLG paper's budget (300 L-BFGS
steps of 20 evaluations)."""
SINGLE_STOP_BELOW = 3e-8
"""``stop_below="auto"`` on one image: the relative gradient distance at which the attack stops; a batch has no
early stop, because half-recovered batches already reach this distance."""


class BatchSettings(NamedTuple):
    """What the ``"auto"`` arguments of a gradient-matching attack resolve to for one view."""

    tv_weight: float
    stop_below: float | None
    max_iterations: int


def resolve_batch_settings(
    *,
    tv_weight: float | Auto,
    stop_below: float | Auto | None,
    max_iterations: int | Auto,
    batch_size: int,
    images: bool = True,
) -> BatchSettings:
    """Explicit values as given, ``"auto"`` ones resolved by ``batch_size``, the inputs per (simulated) gradient.

    One input: no prior, stop at :data:`SINGLE_STOP_BELOW`, :data:`SINGLE_MAX_ITERATIONS` (the paper's objective).
    B > 1: the prior :data:`BATCH_TV_WEIGHT`, no stop, :data:`BATCH_MAX_ITERATIONS`. An update of T steps of one
    image each counts as B = 1. ``images=False`` (inputs that are feature maps, e.g. the private output recovered at
    FDL-PP's cut) never gets the prior: total variation is an image prior.

    Example:
        >>> auto = dict(tv_weight="auto", stop_below="auto", max_iterations="auto")
        >>> resolve_batch_settings(**auto, batch_size=1)
        BatchSettings(tv_weight=0.0, stop_below=3e-08, max_iterations=3000)
        >>> resolve_batch_settings(**auto, batch_size=8, images=False).tv_weight
        0.0
    """
    batch = batch_size > 1
    auto_tv = BATCH_TV_WEIGHT if batch and images else 0.0
    auto_iterations = BATCH_MAX_ITERATIONS if batch else SINGLE_MAX_ITERATIONS
    return BatchSettings(
        tv_weight=auto_tv if tv_weight == "auto" else float(tv_weight),
        stop_below=(None if batch else SINGLE_STOP_BELOW) if stop_below == "auto" else stop_below,
        max_iterations=auto_iterations if max_iterations == "auto" else int(max_iterations),
    )
