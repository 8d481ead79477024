"""Reconstruction metrics: one convention (images in [0, 1], per image, after matching) and named paper variants.

The toolkit's convention (DESIGN.md principle 5): images in [0, 1]; MSE, PSNR (data range 1), SSIM and LPIPS
per image from torchmetrics; a reconstructed batch is first matched to the ground truth with the Hungarian
algorithm (the attacker cannot know the batch order), then scores are averaged over every ground-truth image, an
image the attack returned nothing for scored as a miss (:func:`score_reconstruction`).
Paper-specific variants are their own functions: :func:`fdlpp_privacy_score` (FDL-PP, Gu et al., Eq. 6) and
:func:`psnr_ref_rmse` (the RMSE-based "PSNR" of the thesis' evaluation code, Ren 2023).

Example:
    >>> target = torch.zeros(2, 1, 4, 4)
    >>> preds = target + torch.tensor([0.1, 0.01]).view(2, 1, 1, 1)
    >>> psnr(preds, target)
    tensor([20., 40.])
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

from lightning_fl.attacks.base import Reconstruction
from lightning_fl.messages import GroundTruth

__all__ = [
    "LPIPS_WARNING",
    "MISSED_GUESS",
    "PSNR_CAP",
    "RECOVERED_PSNR",
    "LabelRecoveryAccuracy",
    "attack_success_rate",
    "bootstrap_interval",
    "fdlpp_privacy_score",
    "image_mse",
    "image_successes",
    "label_recovery_accuracy",
    "label_set_accuracy",
    "lpips",
    "match_reconstructions",
    "own_colour_ssim",
    "psnr",
    "psnr_ref_rmse",
    "score_reconstruction",
    "ssim",
]

LPIPS_WARNING = (
    "LPIPS is reported as null: the torchvision AlexNet backbone weights are not in the torch hub cache ({path}) "
    "and this toolkit never downloads during a run. Put the file there (e.g. run "
    "`python -c 'import torchvision; torchvision.models.alexnet(weights=\"DEFAULT\")'` once with a network) "
    "to get LPIPS scores."
)
LPIPS_UNSAFE_WARNING = (
    "LPIPS is reported as null: the AlexNet backbone file {path} is not a plain weights file "
    "(torch.load(weights_only=True) refused it or it lacks AlexNet layers: {reason}); it was not executed. "
    "Delete it and put torchvision's original alexnet-owt-7be5be79.pth there."
)


def _check_images(preds: Tensor, target: Tensor) -> None:
    if preds.ndim != 4 or preds.shape != target.shape:
        raise ValueError(
            f"expected `preds` and `target` of the same shape (N, C, H, W), got {tuple(preds.shape)} and "
            f"{tuple(target.shape)}."
        )


def image_mse(preds: Tensor, target: Tensor) -> Tensor:
    """Per-image mean squared error over pixels, shape ``(N,)``.

    Example:
        >>> image_mse(torch.full((1, 1, 2, 2), 0.5), torch.zeros(1, 1, 2, 2))
        tensor([0.2500])
    """
    _check_images(preds, target)
    return (preds.float() - target.float()).pow(2).flatten(1).mean(1)


PSNR_CAP = 100.0
"""PSNR of an exact copy (MSE 0) is reported as this many dB, so one exact match cannot make a batch mean infinite."""


def psnr(preds: Tensor, target: Tensor) -> Tensor:
    r"""Per-image PSNR in dB with data range 1 (torchmetrics), capped at :data:`PSNR_CAP`, shape ``(N,)``.

    .. math:: \mathrm{PSNR} = \min\Big(10 \log_{10} \frac{1}{\mathrm{MSE}(\hat x, x)},\ 100\Big)

    Example:
        >>> psnr(torch.full((1, 1, 2, 2), 0.1), torch.zeros(1, 1, 2, 2))
        tensor([20.])
    """
    _check_images(preds, target)
    return (
        peak_signal_noise_ratio(preds.float(), target.float(), data_range=1.0, reduction="none", dim=(1, 2, 3))
        .reshape(-1)
        .clamp(max=PSNR_CAP)
    )


RECOVERED_PSNR = 30.0
"""A reconstruction at this PSNR (dB) or above counts as an exact copy in ``score_reconstruction``'s ``recovered``
(Robbing the Fed's measure, Fowl et al., ICLR 2022: the share of a batch recovered exactly)."""


def ssim(preds: Tensor, target: Tensor) -> Tensor:
    """Per-image SSIM (torchmetrics: Gaussian window 11, sigma 1.5, data range 1), shape ``(N,)``.

    torchmetrics averages the SSIM map over the whole reflect-padded image, scikit-image's
    ``structural_similarity`` crops a 5-pixel border first; they agree to 1e-3 on 64x64 images and differ by
    up to a few hundredths on 16x16 ones.

    Example:
        >>> x = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
        >>> ssim(x, x)
        tensor([1., 1.])
    """
    _check_images(preds, target)
    return structural_similarity_index_measure(preds.float(), target.float(), data_range=1.0, reduction="none")


def own_colour_ssim(target: Tensor) -> Tensor:
    """Per-image SSIM of a flat image of each image's own mean colour against it, shape ``(N,)``: what a
    reconstruction that recovered the colour and nothing else scores.

    SSIM is lenient on smooth images (its constants dominate where the local variance is small): a flat patch of
    sky or skin reaches 0.8 with no structure at all. An attack that reads BatchNorm statistics leaked by the update
    learns the first layer's per-channel means, and with them nearly the mean colour; a reconstruction counts as
    more than that only where its SSIM beats this.

    Example:
        >>> smooth = torch.linspace(0.4, 0.5, 16).repeat(3, 16, 1)[None]  # a faint gradient
        >>> noise = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
        >>> own_colour_ssim(torch.cat([smooth, noise])).round(decimals=2)
        tensor([0.9100, 0.0100])
    """
    flat = target.float().mean(dim=(-2, -1), keepdim=True).expand_as(target)
    return ssim(flat, target)


def _alexnet_weights_path() -> Path:
    from torchvision.models import AlexNet_Weights

    return Path(torch.hub.get_dir()) / "checkpoints" / Path(AlexNet_Weights.DEFAULT.url).name


def _load_alexnet_backbone(slices: torch.nn.Module, path: Path) -> None:
    """Copy the ``features.*`` tensors of the hub-cache AlexNet file into torchmetrics' AlexNet ``slices``.

    The file is read with ``torch.load(weights_only=True)``: torchvision (and so torchmetrics) would read it with
    ``weights_only=False``, which runs any pickled code planted in the cache. torchmetrics splits torchvision's
    ``features.<i>`` into ``slice<k>.<i>``, keeping the index ``i``.

    Raises:
        ValueError: with the reason, if the file is refused by the safe unpickler or lacks an AlexNet layer.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as err:
        raise ValueError(" ".join(str(err).split())[:160]) from None
    state = state if isinstance(state, dict) else {}
    backbone = {
        f"{slice_name}.{name}": state.get(f"features.{name}")
        for slice_name, block in slices.named_children()
        for name, _ in block.named_parameters()
    }
    missing = sorted(k for k, v in backbone.items() if not isinstance(v, Tensor))
    if missing:
        raise ValueError(f"no AlexNet tensors for {missing[:2]}")
    try:
        slices.load_state_dict(backbone)
    except RuntimeError as err:
        raise ValueError(" ".join(str(err).split())[:160]) from None


@cache
def _lpips_metric() -> Any:
    """The LPIPS (AlexNet) network of torchmetrics, or ``None`` with one warning when the backbone weights are absent.

    The network is built with a random backbone (torchvision reads nothing from the hub cache) and the cached
    ImageNet weights are copied in by :func:`_load_alexnet_backbone`; LPIPS' linear layers ship with torchmetrics.
    """
    from torchmetrics.functional.image.lpips import _NoTrainLpips

    path = _alexnet_weights_path()
    if not path.exists():
        warnings.warn(LPIPS_WARNING.format(path=path), stacklevel=3)
        return None
    net = _NoTrainLpips(net="alex", pnet_rand=True)
    try:
        _load_alexnet_backbone(net.net, path)
    except ValueError as err:
        warnings.warn(LPIPS_UNSAFE_WARNING.format(path=path, reason=err), stacklevel=3)
        return None
    return net.eval()


def lpips(preds: Tensor, target: Tensor) -> Tensor | None:
    """Per-image LPIPS (AlexNet, lower is better), or ``None`` when the backbone weights are not available offline.

    Grey images are repeated to three channels. The first call without weights warns once; later calls stay silent.
    """
    _check_images(preds, target)
    metric = _lpips_metric()
    if metric is None:
        return None
    expand = (lambda x: x.expand(-1, 3, -1, -1)) if preds.shape[1] == 1 else (lambda x: x)
    with torch.no_grad():
        return metric(expand(preds.float()), expand(target.float()), normalize=True).reshape(-1)


def match_reconstructions(preds: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Pair each reconstruction with a distinct ground-truth image, minimising the total MSE (Hungarian algorithm).

    The attacker cannot know the order of a batch, so a batch is scored after this matching
    (Inferred: the thesis leaves batch scoring open).
    ``target`` may hold more images than ``preds`` (e.g. the clients' sets behind an aggregate);
    every reconstruction is then matched to one distinct image of it.

    Returns:
        ``(pred_index, target_index)``, two index tensors of length ``min(len(preds), len(target))``.

    Example:
        >>> target = torch.stack([torch.zeros(1, 2, 2), torch.ones(1, 2, 2)])
        >>> match_reconstructions(target.flip(0), target)
        (tensor([0, 1]), tensor([1, 0]))
    """
    if preds.shape[1:] != target.shape[1:]:
        raise ValueError(
            f"reconstructions of shape {tuple(preds.shape[1:])} cannot be matched to ground truth of shape "
            f"{tuple(target.shape[1:])}."
        )
    if len(preds) == 0 or len(target) == 0:  # an attack that returned nothing matches nothing
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    cost = torch.cdist(preds.flatten(1).double(), target.flatten(1).double()).pow(2) / preds[0].numel()
    rows, cols = linear_sum_assignment(cost.numpy())
    return torch.as_tensor(rows, dtype=torch.long), torch.as_tensor(cols, dtype=torch.long)


def _label_recovery_update(preds: Tensor, target: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    if preds.shape != target.shape:
        raise ValueError(f"expected `preds` and `target` of one shape, got {tuple(preds.shape)} and {target.shape}.")
    hits = torch.minimum(preds.bincount(minlength=num_classes), target.bincount(minlength=num_classes)).sum()
    return hits, torch.tensor(target.numel())


def _label_recovery_compute(hits: Tensor, total: Tensor) -> Tensor:
    return hits / total


def label_recovery_accuracy(preds: Tensor, target: Tensor, num_classes: int) -> Tensor:
    """Share of true labels recovered, compared as multisets (the attacker cannot know the batch order).

    Implements the label-inference accuracy of the thesis' Table 3.13 (Ren 2023) for batches, which the thesis
    leaves open: |multiset(preds) ∩ multiset(target)| / B (Inferred).

    Example:
        >>> label_recovery_accuracy(torch.tensor([1, 1, 3]), torch.tensor([3, 1, 2]), num_classes=4)
        tensor(0.6667)
    """
    return _label_recovery_compute(*_label_recovery_update(preds, target, num_classes))


def label_set_accuracy(preds: Tensor, target: Tensor) -> float:
    """Jaccard index of the recovered and the true class sets: which classes a batch holds, whatever their counts
    (the class-level accuracy of label-recovery papers, next to the count-level :func:`label_recovery_accuracy`).

    Example:
        >>> label_set_accuracy(torch.tensor([1, 1, 3]), torch.tensor([3, 1, 2]))
        0.6666666666666666
    """
    found, true = set(preds.tolist()), set(target.tolist())
    return len(found & true) / len(found | true)


class LabelRecoveryAccuracy(Metric):
    """Accumulates :func:`label_recovery_accuracy` over several attacked batches.

    Args:
        num_classes: number of classes.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Example:
        >>> metric = LabelRecoveryAccuracy(num_classes=4)
        >>> metric.update(torch.tensor([1, 1]), torch.tensor([1, 2]))
        >>> metric.update(torch.tensor([3]), torch.tensor([3]))
        >>> metric.compute()
        tensor(0.6667)
    """

    is_differentiable, higher_is_better, full_state_update = False, True, False

    def __init__(self, num_classes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.add_state("hits", default=torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        hits, total = _label_recovery_update(preds, target, self.num_classes)
        self.hits, self.total = self.hits + hits, self.total + total

    def compute(self) -> Tensor:
        return _label_recovery_compute(self.hits, self.total)


def attack_success_rate(scores: Tensor, *, threshold: float) -> Tensor:
    """Share of reconstructions whose score (PSNR, SSIM, ...: higher is better) reaches ``threshold``.

    The thesis calls an attack successful when the image is "visually recognisable" (Table 3.6); an SSIM
    threshold (e.g. 0.6, the FedKL code's proxy) or a PSNR threshold is an operational proxy, not the same
    criterion (Inferred: the thesis names no threshold). For a lower-is-better score pass its negation and threshold.

    Example:
        >>> attack_success_rate(torch.tensor([12.0, 31.0, 45.0]), threshold=30.0)
        tensor(0.6667)
    """
    if scores.numel() == 0:
        raise ValueError("attack_success_rate needs at least one score.")
    return (scores >= threshold).float().mean()


def bootstrap_interval(
    values: Sequence[float] | Tensor, *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    r"""The mean of ``values`` and its percentile bootstrap interval (Efron & Tibshirani, *An Introduction to the
    Bootstrap*, 1993, Sec. 13.3).

    ``values`` are resampled with replacement ``resamples`` times; the interval's ends are the
    :math:`(1 - c)/2` and :math:`(1 + c)/2` quantiles of the resampled means (:math:`c` = ``confidence``). The
    resampling is seeded, so the same values give the same interval. The bench resamples images: each value is one
    attacked image's score. On shares (0/1 values) the interval collapses to a point when every value is equal.

    Args:
        values: one score per unit (image), at least one; non-finite values are refused.
        confidence: coverage of the interval, in (0, 1).
        resamples: bootstrap resamples, >= 1.
        seed: seed of the resampling.

    Returns:
        ``(mean, low, high)``.

    Raises:
        ValueError: on no values, a non-finite value, ``confidence`` outside (0, 1) or ``resamples < 1``.

    Example:
        >>> bootstrap_interval([2.0, 2.0, 2.0])
        (2.0, 2.0, 2.0)
        >>> mean, low, high = bootstrap_interval([0.0, 1.0] * 50)  # standard error 0.05: about mean ± 0.1
        >>> mean, round(low, 2), round(high, 2)
        (0.5, 0.4, 0.6)
    """
    data = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    if data.numel() == 0 or not bool(torch.isfinite(data).all()):
        raise ValueError(f"bootstrap_interval needs at least one finite value, got {data.tolist()[:5]}.")
    if not 0.0 < confidence < 1.0 or resamples < 1:
        raise ValueError(f"confidence={confidence} must be in (0, 1) and resamples={resamples} >= 1.")
    generator = torch.Generator().manual_seed(seed)
    means = data[torch.randint(data.numel(), (resamples, data.numel()), generator=generator)].mean(1)
    tails = torch.tensor([(1.0 - confidence) / 2, (1.0 + confidence) / 2], dtype=torch.float64)
    low, high = torch.quantile(means, tails).tolist()
    return float(data.mean()), low, high


def fdlpp_privacy_score(mse: Tensor | float, *, alpha: float = 0.1) -> Tensor:
    r"""The FDL-PP privacy score :math:`f(x) = 2x^\alpha / (1 + x^\alpha)` of a reconstruction MSE (higher: private).

    Implements Eq. (6) of FDL-PP (Gu et al.). Eq. (6) writes :math:`x` as a pixel *sum*; the values behind the
    paper's Table 1 imply a per-pixel mean on [0, 1], so pass :func:`image_mse`.
    Inferred: per-pixel mean, which those values imply. :math:`f` maps :math:`(0, \infty)` onto :math:`(0, 2)`.

    Args:
        mse: reconstruction error :math:`x` (per-pixel mean squared error on [0, 1] images).
        alpha: exponent :math:`\alpha` (0.1 in the paper).

    Example:
        >>> fdlpp_privacy_score(torch.tensor([1.0, 0.2560]))
        tensor([1.0000, 0.9320])
    """
    if alpha <= 0:
        raise ValueError(f"`alpha` must be > 0, got {alpha}; the paper uses 0.1.")
    powered = torch.as_tensor(mse, dtype=torch.float32).clamp_min(0).pow(alpha)
    return 2 * powered / (1 + powered)


def psnr_ref_rmse(preds: Tensor, target: Tensor) -> Tensor:
    r"""The thesis' reference-code "PSNR": :math:`10 \log_{10}(255^2 / \mathrm{RMSE})` on 8-bit images, per image.

    Implements the metric of the FedKL evaluation code behind Table 5.6 of the thesis (Ren 2023, §5.3.1; probably
    Tables 3.4 and 3.16 too): images quantised to 0-255 as a saved PNG is, then the *root* mean squared error
    in the denominator. Convert to the standard PSNR with :math:`2\,\mathrm{PSNR}^* - 48.13`.
    Use it only to compare with those tables.

    Example:
        >>> target = torch.zeros(1, 1, 2, 2)
        >>> psnr_ref_rmse(target + 10 / 255, target)
        tensor([38.1308])
    """
    _check_images(preds, target)

    def to_uint8(x: Tensor) -> Tensor:  # torchvision.utils.save_image's conversion
        return x.float().mul(255).add(0.5).clamp(0, 255).floor()

    rmse = (to_uint8(preds) - to_uint8(target)).pow(2).flatten(1).mean(1).sqrt()
    return 10 * torch.log10(255.0**2 / rmse.clamp_min(1e-8))


MISSED_GUESS = 0.5
"""The pixel value of the image a ground-truth image is scored against when the attack returned no reconstruction
for it: a mid-grey image, the guess of an attacker who has nothing (and what
:class:`~lightning_fl.attacks.robbing_the_fed.RobbingTheFedAttack` puts where a bin divides by zero)."""


def _mean_or_none(values: Tensor | None) -> float | None:
    return None if values is None else float(values.mean())


def score_reconstruction(
    reconstruction: Reconstruction, ground_truth: GroundTruth, *, num_classes: int | None = None
) -> dict[str, Any]:
    """Match a reconstruction to the ground truth and average the per-image metrics over every ground-truth image.

    An attack may return fewer images than it attacked (Robbing the Fed returns one per non-empty bin). Each
    returned image is matched to a distinct ground-truth image (:func:`match_reconstructions`); a ground-truth
    image left without one is a miss, scored against a mid-grey image (:data:`MISSED_GUESS`), so every mean is over
    all the attacked images and a miss counts as what it is.

    Returns the metric part of a ``summary.json["attacks"]`` entry: ``mse``, ``psnr``, ``ssim``, ``lpips``
    (``None`` when unavailable) and ``psnr_ref_rmse`` (thesis variant), each a mean over the ``num_images``
    ground-truth images, misses included; ``label_accuracy`` (``None`` when the attack recovers no labels; the
    labels of the matched pairs compared as multisets, over ``num_images``: a miss's label is not recovered);
    ``num_images`` (ground-truth images attacked), ``reconstructed`` (those the attack returned an image for),
    ``recovered`` (those at PSNR >= :data:`RECOVERED_PSNR`: recovered exactly), ``psnr_capped`` (those at the
    :data:`PSNR_CAP` of an exact copy, counted at 100 dB in ``psnr``: the mean is then a lower bound),
    ``own_colour_ssim`` (the mean of :func:`own_colour_ssim`: what the colour alone scores) and ``beyond_colour``
    (images whose SSIM beats their own colour's) and ``per_image``: the ``psnr``, ``ssim``, ``lpips`` (``None`` when
    unavailable), ``own_colour_ssim`` and ``reconstructed`` flag of each ground-truth image, in the ground truth's
    order (what an interval over images resamples).

    Example:
        >>> images = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
        >>> truth = GroundTruth(images, torch.tensor([3, 5]))
        >>> rec = Reconstruction(truth.inputs.flip(0), torch.tensor([5, 3]))
        >>> scores = score_reconstruction(rec, truth)
        >>> scores["mse"], scores["label_accuracy"], scores["num_images"], scores["recovered"], scores["psnr_capped"]
        (0.0, 1.0, 2, 2, 2)
        >>> scores["per_image"]["psnr"]
        [100.0, 100.0]
        >>> missed = score_reconstruction(Reconstruction(truth.inputs[1:], None), truth)
        >>> missed["num_images"], missed["reconstructed"], missed["recovered"], missed["per_image"]["reconstructed"]
        (2, 1, 1, [False, True])
        >>> round(missed["psnr"], 1), round(missed["per_image"]["psnr"][0], 1)
        (55.5, 10.9)
    """
    truth = ground_truth.inputs.detach().cpu()
    images = reconstruction.images.detach().cpu().to(truth.dtype).clamp(0, 1)
    rows, cols = match_reconstructions(images, truth)
    preds = torch.full_like(truth, MISSED_GUESS)  # a ground-truth image without a reconstruction: a mid-grey guess
    preds[cols] = images[rows]
    reconstructed = torch.zeros(len(truth), dtype=torch.bool)
    reconstructed[cols] = True
    psnrs, ssims, lpipss = psnr(preds, truth), ssim(preds, truth), lpips(preds, truth)
    colours = own_colour_ssim(truth)
    label_accuracy = None
    if reconstruction.labels is not None:
        labels, targets = reconstruction.labels.cpu()[rows], ground_truth.targets.cpu()[cols]
        classes = num_classes or int(max(reconstruction.labels.max(), ground_truth.targets.max())) + 1
        hits, _ = _label_recovery_update(labels, targets, classes)
        label_accuracy = float(hits) / len(truth)
    return {
        "mse": float(image_mse(preds, truth).mean()),
        "psnr": float(psnrs.mean()),
        "ssim": float(ssims.mean()),
        "lpips": _mean_or_none(lpipss),
        "label_accuracy": label_accuracy,
        "psnr_ref_rmse": float(psnr_ref_rmse(preds, truth).mean()),
        "num_images": len(truth),
        "reconstructed": len(rows),
        "recovered": int((psnrs >= RECOVERED_PSNR).sum()),
        "psnr_capped": int((psnrs >= PSNR_CAP).sum()),
        "own_colour_ssim": float(colours.mean()),
        "beyond_colour": int((ssims > colours).sum()),
        "per_image": {
            "psnr": psnrs.tolist(),
            "ssim": ssims.tolist(),
            "lpips": None if lpipss is None else lpipss.tolist(),
            "own_colour_ssim": colours.tolist(),
            "reconstructed": reconstructed.tolist(),
        },
    }


def image_successes(images: Mapping[str, Sequence[float]], bar: float) -> list[float]:
    """1.0 for each attacked image whose SSIM reaches ``bar`` and beats both references the cell holds for it, else
    0.0: the SSIM of a flat image of its own mean colour (``images["own_colour_ssim"]``: on smooth photos the colour
    alone reaches the bar) and the best prior-only guess of it (``images["guess_ssim"]``: a public image of its
    class or the data set's mean, which never reads the update; on digits such a guess reaches SSIM 0.5 on most
    images). A reference the cell lacks for some image (a cell stored before it) is not applied.

    Example:
        >>> image_successes({"ssim": [0.8, 0.6, 0.3], "own_colour_ssim": [0.9, 0.2, 0.1]}, 0.5)
        [0.0, 1.0, 0.0]
        >>> image_successes({"ssim": [0.8, 0.6], "own_colour_ssim": [0.1, 0.1], "guess_ssim": [0.7, 0.65]}, 0.5)
        [1.0, 0.0]
    """
    ssims = images.get("ssim") or []
    references = [images.get(key) or [] for key in ("own_colour_ssim", "guess_ssim")]
    references = [r for r in references if len(r) == len(ssims)]
    return [float(v >= bar and all(v > r[i] for r in references)) for i, v in enumerate(ssims)]
