"""Metrics against independent references (scikit-image, brute force) and the papers' numbers."""

from __future__ import annotations

import itertools
import statistics
import warnings

import pytest
import torch
from skimage.metrics import peak_signal_noise_ratio as sk_psnr
from skimage.metrics import structural_similarity as sk_ssim

from lightning_fl.attacks import Reconstruction
from lightning_fl.attacks import metrics as M
from lightning_fl.messages import GroundTruth


def _pair(seed: int, shape=(3, 1, 16, 16), noise: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    target = torch.rand(*shape, generator=g)
    return (target + noise * torch.randn(*shape, generator=g)).clamp(0, 1), target


@pytest.mark.parametrize(("seed", "noise"), [(0, 0.05), (1, 0.2), (2, 0.5)])
def test_psnr_matches_skimage_per_image(seed: int, noise: float) -> None:
    preds, target = _pair(seed, noise=noise)
    expected = [sk_psnr(t.numpy(), p.numpy(), data_range=1.0) for p, t in zip(preds, target, strict=True)]
    assert torch.allclose(M.psnr(preds, target), torch.tensor(expected, dtype=torch.float32), atol=1e-3)


@pytest.mark.parametrize(("seed", "shape"), [(0, (2, 1, 64, 64)), (1, (2, 3, 64, 64))])
def test_ssim_matches_skimage_gaussian_window(seed: int, shape: tuple[int, ...]) -> None:
    # the two differ only at the border (torchmetrics averages a reflect-padded map, skimage crops it): 64x64
    # keeps that effect below the tolerance
    preds, target = _pair(seed, shape=shape)
    expected = [
        sk_ssim(
            t.numpy(),
            p.numpy(),
            data_range=1.0,
            channel_axis=0,
            gaussian_weights=True,
            sigma=1.5,
            use_sample_covariance=False,
        )
        for p, t in zip(preds, target, strict=True)
    ]
    assert torch.allclose(M.ssim(preds, target), torch.tensor(expected, dtype=torch.float32), atol=1e-3)


def test_psnr_of_exact_copy_is_capped() -> None:
    x = torch.rand(2, 1, 8, 8)
    assert torch.equal(M.psnr(x, x), torch.full((2,), M.PSNR_CAP))


def test_match_reconstructions_finds_the_optimal_assignment() -> None:
    preds, target = _pair(3, shape=(4, 1, 6, 6), noise=0.3)
    target = torch.cat([target, torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(9))])
    rows, cols = M.match_reconstructions(preds, target)
    cost = torch.cdist(preds.flatten(1), target.flatten(1)).pow(2)
    best = min(itertools.permutations(range(6), 4), key=lambda perm: sum(cost[i, j] for i, j in enumerate(perm)))
    assert rows.tolist() == [0, 1, 2, 3] and cols.tolist() == list(best)


def test_score_reconstruction_is_order_invariant() -> None:
    preds, target = _pair(4, shape=(3, 1, 16, 16))
    labels = torch.tensor([1, 4, 7])
    truth = GroundTruth(target, labels)
    perm = torch.tensor([2, 0, 1])
    ordered = M.score_reconstruction(Reconstruction(preds, labels), truth)
    shuffled = M.score_reconstruction(Reconstruction(preds[perm], labels[perm]), truth)
    per_image, shuffled_per_image = ordered.pop("per_image"), shuffled.pop("per_image")
    assert ordered == pytest.approx(shuffled)
    for metric in ("psnr", "ssim"):  # listed in ground-truth order, whatever the order of the reconstructions
        assert per_image[metric] == pytest.approx(shuffled_per_image[metric])
        assert statistics.fmean(per_image[metric]) == pytest.approx(ordered[metric])
    assert ordered["label_accuracy"] == 1.0


def test_label_recovery_accuracy_counts_multisets() -> None:
    assert M.label_recovery_accuracy(torch.tensor([2, 2, 2]), torch.tensor([2, 2, 5]), num_classes=6) == pytest.approx(
        2 / 3
    )
    with pytest.raises(ValueError, match="of one shape"):
        M.label_recovery_accuracy(torch.tensor([1]), torch.tensor([1, 2]), num_classes=3)


def test_fdlpp_privacy_score_matches_paper_table_value_and_is_monotone() -> None:
    # spec_001_004 A4: f(1) = 1 and Table 1's 0.932 corresponds to x = 0.256
    assert M.fdlpp_privacy_score(1.0) == pytest.approx(1.0)
    assert M.fdlpp_privacy_score(0.256) == pytest.approx(0.932, abs=1e-3)
    values = M.fdlpp_privacy_score(torch.logspace(-8, 2, 50))
    assert (values.diff() > 0).all() and values.max() < 2
    with pytest.raises(ValueError, match="alpha"):
        M.fdlpp_privacy_score(1.0, alpha=0.0)


def test_psnr_ref_rmse_relates_to_standard_psnr_as_the_thesis_conversion_says() -> None:
    # spec_003 §3.7: PSNR_std = 2 * PSNR_table - 48.13, exact on 8-bit images
    preds, target = _pair(5, noise=0.1)
    preds, target = (preds * 255).round() / 255, (target * 255).round() / 255
    assert torch.allclose(2 * M.psnr_ref_rmse(preds, target) - 48.13, M.psnr(preds, target), atol=0.01)


def test_attack_success_rate_counts_scores_at_or_above_threshold() -> None:
    assert M.attack_success_rate(torch.tensor([0.5, 0.6, 0.9, 0.1]), threshold=0.6) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least one"):
        M.attack_success_rate(torch.tensor([]), threshold=0.6)


def test_lpips_is_null_with_one_warning_when_weights_are_absent() -> None:
    if M._alexnet_weights_path().exists():
        pytest.skip("AlexNet weights are cached here; LPIPS is available")
    M._lpips_metric.cache_clear()
    preds, target = _pair(6)
    with pytest.warns(UserWarning, match="LPIPS is reported as null"):
        assert M.lpips(preds, target) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert M.lpips(preds, target) is None


def test_metrics_reject_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"same shape \(N, C, H, W\), got \(1, 1, 4, 4\) and \(1, 1, 4, 5\)"):
        M.psnr(torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 4, 5))


def test_bootstrap_interval_of_a_normal_mean_has_the_textbook_width_and_coverage() -> None:
    """Known case: the mean of n draws of N(0, 1) has standard error 1/sqrt(n), so a 95 % interval spans about
    2 x 1.96 / sqrt(n) and covers the true mean 0 in about 95 % of samples (the percentile bootstrap a little less
    at small n)."""
    sample = torch.randn(400, generator=torch.Generator().manual_seed(0))
    mean, low, high = M.bootstrap_interval(sample)
    assert mean == pytest.approx(float(sample.double().mean())) and low < mean < high
    assert high - low == pytest.approx(2 * 1.96 / 400**0.5, rel=0.15)
    covered = 0
    for seed in range(200):
        _, low, high = M.bootstrap_interval(torch.randn(100, generator=torch.Generator().manual_seed(seed)), seed=seed)
        covered += low <= 0.0 <= high
    assert 0.88 <= covered / 200 <= 0.99
    assert M.bootstrap_interval(sample, seed=3) == M.bootstrap_interval(sample, seed=3)  # seeded


@pytest.mark.parametrize(
    ("values", "kwargs", "match"),
    [([], {}, "at least one"), ([1.0, float("inf")], {}, "finite"), ([1.0], {"confidence": 1.0}, "confidence")],
)
def test_bootstrap_interval_refuses_what_it_cannot_resample(values, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        M.bootstrap_interval(values, **kwargs)


@pytest.mark.parametrize("returned", [3, 0])
def test_score_reconstruction_counts_a_missed_image_as_a_miss(returned: int) -> None:
    """An attack that returns fewer images than it attacked (Robbing the Fed: one per non-empty bin) is scored over
    every attacked image; a missed one is scored against the mid-grey guess, and exact copies are counted as capped."""
    target = torch.rand(4, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    truth = GroundTruth(target, torch.zeros(4, dtype=torch.long))
    scores = M.score_reconstruction(Reconstruction(target[:returned].flip(0), None), truth)
    guess = M.psnr(torch.full_like(target[3:], M.MISSED_GUESS), target[3:])
    assert scores["num_images"] == 4 and scores["reconstructed"] == returned
    assert scores["recovered"] == scores["psnr_capped"] == returned
    assert scores["per_image"]["reconstructed"] == [i < returned for i in range(4)]
    assert len(scores["per_image"]["psnr"]) == len(scores["per_image"]["ssim"]) == 4
    assert scores["per_image"]["psnr"][3] == pytest.approx(float(guess))
    assert scores["psnr"] == pytest.approx(statistics.fmean(scores["per_image"]["psnr"]))
    assert scores["psnr"] < 100.0 and scores["ssim"] < 1.0
