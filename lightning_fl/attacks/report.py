"""One report of an attack: scores plus a labelled ground-truth-vs-reconstruction grid a person can read.

Used by the :class:`~lightning_fl.callbacks.GradientLeakage` callback and by the standalone runner
(``lightning-fl attack``), so both write the same ``summary.json`` fields and the same picture: each matched
pair is one column, ground truth on top and reconstruction below, every image upscaled (nearest neighbour) to at
least :data:`MIN_CELL` pixels, captioned with the true label (and the image's source when known) and the
recovered label with the pair's PSNR and SSIM.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor

from lightning_fl.attacks.base import Reconstruction
from lightning_fl.attacks.metrics import match_reconstructions, psnr, score_reconstruction, ssim
from lightning_fl.messages import GroundTruth

__all__ = ["MIN_CELL", "attack_report", "labelled_grid"]

MIN_CELL = 128
"""Smallest side, in pixels, of one image in the grid."""

_CAPTION = 34  # pixels of text under each image
_PAD = 6


def _cell(image: Tensor, size: int) -> Image.Image:
    scaled = F.interpolate(image[None].float().clamp(0, 1), size=(size, size), mode="nearest")[0]
    array = scaled.mul(255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    return Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array).convert("RGB")


def labelled_grid(
    truth: Tensor,
    reconstruction: Tensor,
    *,
    true_labels: Sequence[int | None],
    recovered_labels: Sequence[int | None],
    psnrs: Sequence[float],
    ssims: Sequence[float],
    names: Sequence[str] | None = None,
    title: str = "",
    cell: int = MIN_CELL,
) -> Image.Image:
    """Ground truth (top row) against the matched reconstructions (bottom row), captioned per pair.

    Args:
        truth: ``(N, C, H, W)`` in [0, 1].
        reconstruction: ``(N, C, H, W)``, matched to ``truth`` column by column.
        true_labels: per column; ``None`` where unknown.
        recovered_labels: per column; ``None`` when the attack recovers no labels.
        psnrs: per-pair PSNR in dB.
        ssims: per-pair SSIM.
        names: per column, where the true image came from (shortened to fit).
        title: a line above the grid.
        cell: side of one upscaled image, at least :data:`MIN_CELL`.

    Example:
        >>> grid = labelled_grid(torch.zeros(2, 3, 8, 8), torch.ones(2, 3, 8, 8), true_labels=[1, 2],
        ...                      recovered_labels=[1, None], psnrs=[0.0, 0.0], ssims=[0.0, 0.0])
        >>> grid.size[0] >= 2 * MIN_CELL, grid.size[1] >= 2 * MIN_CELL
        (True, True)
    """
    cell = max(cell, MIN_CELL)
    count = len(truth)
    font = ImageFont.load_default(size=12)
    head = 20 if title else 0
    width = max(_PAD + count * (cell + _PAD), 2 * _PAD + int(font.getlength(title)) if title else 0)
    height = head + 2 * (cell + _CAPTION) + _PAD
    canvas = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(canvas)
    if title:
        draw.text((_PAD, 4), title, fill="black", font=font)
    for k in range(count):
        x = _PAD + k * (cell + _PAD)
        truth_text = f"truth: label {true_labels[k]}"
        source = _tail_that_fits(names[k] if names else "", cell, font)
        recovered = "-" if recovered_labels[k] is None else recovered_labels[k]
        ok = (
            ""
            if recovered_labels[k] is None or true_labels[k] is None
            else (" ok" if recovered_labels[k] == true_labels[k] else " WRONG")
        )
        recon_text = f"recon: label {recovered}{ok}\nPSNR {psnrs[k]:.1f} dB  SSIM {ssims[k]:.2f}"
        canvas.paste(_cell(truth[k], cell), (x, head))
        draw.multiline_text((x, head + cell + 2), f"{truth_text}\n{source}", fill="black", font=font, spacing=2)
        y = head + cell + _CAPTION
        canvas.paste(_cell(reconstruction[k], cell), (x, y))
        draw.multiline_text((x, y + cell + 2), recon_text, fill="black", font=font, spacing=2)
    return canvas


def _tail_that_fits(text: str, width: int, font: ImageFont.ImageFont) -> str:
    """``text``, or its end behind an ellipsis, narrow enough for ``width`` pixels (a path keeps its file name)."""
    if font.getlength(text) <= width:
        return text
    for start in range(1, len(text)):
        tail = "…" + text[start:]
        if font.getlength(tail) <= width:
            return tail
    return ""


def attack_report(
    reconstruction: Reconstruction,
    ground_truth: GroundTruth,
    *,
    num_classes: int | None,
    path: str | Path | None,
    names: Sequence[str] | None = None,
    title: str = "",
) -> dict[str, object]:
    """Score ``reconstruction`` against ``ground_truth`` and (when ``path`` is given) save the labelled grid there.

    Returns the scores of :func:`~lightning_fl.attacks.metrics.score_reconstruction`, plus ``image`` (the PNG path,
    or ``None``) and ``matched_sources`` (``names`` of the matched ground-truth images, when given).
    """
    scores: dict[str, object] = dict(score_reconstruction(reconstruction, ground_truth, num_classes=num_classes))
    truth = ground_truth.inputs.detach().cpu().float()
    images = reconstruction.images.detach().cpu().float().clamp(0, 1)
    rows, cols = match_reconstructions(images, truth)
    sources = [names[int(c)] for c in cols] if names is not None else None
    scores["matched_sources"] = sources
    scores["image"] = None
    if path is not None:
        recovered = reconstruction.labels
        grid = labelled_grid(
            truth[cols],
            images[rows],
            true_labels=[int(t) for t in ground_truth.targets.cpu()[cols]],
            recovered_labels=[None] * len(rows) if recovered is None else [int(r) for r in recovered.cpu()[rows]],
            psnrs=psnr(images[rows], truth[cols]).tolist(),
            ssims=ssim(images[rows], truth[cols]).tolist(),
            names=sources,
            title=title,
        )
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        grid.save(path)
        scores["image"] = str(path)
    return scores
