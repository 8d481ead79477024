"""Label counts from the classifier's gradient (Geng et al., 2021) on real digits batches with repeated labels."""

from __future__ import annotations

import pytest
import torch

from lightning_fl.attacks.label_counts import dummy_statistics
from lightning_fl.attacks.labels import infer_labels, last_layer_bias_name, last_layer_weight_name
from lightning_fl.attacks.metrics import label_recovery_accuracy
from tests.attacks.views import digits_view


def _accuracy(batch_size: int, seed: int, strategy: str) -> float:
    view, truth = digits_view(batch_size=batch_size, seed=seed)
    weight = last_layer_weight_name(view.model, num_classes=10)
    bias = last_layer_bias_name(view.model, weight_name=weight)
    dummy = dummy_statistics(view.model, classifier_weight=weight, input_shape=truth.inputs.shape[1:])
    labels = infer_labels(
        view.tensors[weight], num_images=batch_size, strategy=strategy, bias_gradient=view.tensors[bias], dummy=dummy
    )
    assert len(labels) == batch_size
    return float(label_recovery_accuracy(labels, truth.targets, num_classes=10))


@pytest.mark.parametrize(("batch_size", "bar"), [(8, 0.95), (32, 0.9)])
def test_bias_count_recovers_the_labels_of_a_batch_with_repeats(batch_size: int, bar: float) -> None:
    # the untrained sigmoid LeNet at the DLG init, 5 victims; the ranking rules stay below (llg about 0.7-0.8)
    scores = [_accuracy(batch_size, seed, "bias_count") for seed in range(5)]
    assert sum(scores) / len(scores) >= bar
    assert sum(scores) / len(scores) > sum(_accuracy(batch_size, seed, "llg") for seed in range(5)) / 5


@pytest.mark.parametrize("strategy", ["bias_count", "weight_count"])
@pytest.mark.parametrize("seed", range(3))
def test_count_strategies_are_exact_for_one_image(strategy: str, seed: int) -> None:
    assert _accuracy(1, seed, strategy) == 1.0


def test_count_strategies_name_their_missing_inputs() -> None:
    with pytest.raises(ValueError, match=r"'bias_count' needs bias_gradient and dummy.*strategy='weight_count'"):
        infer_labels(torch.zeros(3, 4), num_images=2, strategy="bias_count")
    with pytest.raises(ValueError, match=r"'weight_count' needs dummy"):
        infer_labels(torch.zeros(3, 4), num_images=2, strategy="weight_count")


def test_counts_far_below_the_batch_still_give_one_label_per_image() -> None:
    # a trained model's update of a client's 65 images: the floors add up to 50, 15 short with only 10 classes
    from lightning_fl.attacks.label_counts import counts_to_labels

    counts = torch.tensor([9.9, 8.1, 7.5, 6.2, 5.05, 4.04, 3.03, 3.02, 3.01, 2.0])
    labels = counts_to_labels(counts, num_images=65)
    assert len(labels) == 65  # every class one more, then the 5 largest remainders one more again
    assert torch.bincount(labels, minlength=10).tolist() == [11, 10, 9, 8, 7, 5, 4, 4, 4, 3]
