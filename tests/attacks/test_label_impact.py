"""LLG+ (Wainakh et al., 2022): impact and offset measured on the model, on real digits batches with repeated labels."""

from __future__ import annotations

import pytest
import torch

from lightning_fl.attacks.label_counts import dummy_inputs
from lightning_fl.attacks.label_impact import label_impact
from lightning_fl.attacks.labels import infer_labels, last_layer_weight_name
from lightning_fl.attacks.matching_labels import target_label_sets
from lightning_fl.attacks.metrics import label_recovery_accuracy
from lightning_fl.attacks.targets import matching_target
from tests.attacks.views import digits_view


def _accuracies(batch_size: int, seeds: range) -> dict[str, float]:
    scores: dict[str, list[float]] = {"llg": [], "llg_plus": []}
    for seed in seeds:
        view, truth = digits_view(batch_size=batch_size, seed=seed)
        weight = last_layer_weight_name(view.model, num_classes=10)
        dummies = dummy_inputs(64, input_shape=truth.inputs.shape[1:], seed=seed)
        impact = label_impact(view.model, classifier_weight=weight, inputs_per_class=[dummies] * 10)
        for strategy, found in scores.items():
            labels = infer_labels(view.tensors[weight], num_images=batch_size, strategy=strategy, impact=impact)
            assert len(labels) == batch_size
            found.append(float(label_recovery_accuracy(labels, truth.targets, num_classes=10)))
    return {strategy: sum(found) / len(found) for strategy, found in scores.items()}


def test_llg_plus_recovers_a_batch_with_repeats_where_llg_simple_does_not() -> None:
    # the untrained sigmoid LeNet at the DLG init, B = 32 digits drawn at random (labels repeat), 5 victims
    accuracy = _accuracies(32, range(5))
    assert accuracy["llg_plus"] >= 0.9
    assert accuracy["llg_plus"] >= accuracy["llg"] + 0.1  # the measured offset and impact, not the batch's own


def test_llg_plus_is_exact_for_one_image() -> None:
    assert _accuracies(1, range(3))["llg_plus"] == 1.0


def test_llg_plus_names_its_missing_inputs() -> None:
    with pytest.raises(ValueError, match=r"'llg_plus' needs impact=label_impact"):
        infer_labels(torch.zeros(3, 4), num_images=2, strategy="llg_plus")
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    with pytest.raises(ValueError, match=r"inputs_per_class has 2 batches; LLG\+ needs one per class \(3\)"):
        label_impact(net, classifier_weight="1.weight", inputs_per_class=[torch.rand(2, 4)] * 2)


def test_attacks_infer_llg_plus_labels_from_the_view() -> None:
    """What IDLGAttack/InvertingGradientsAttack(label_strategy="llg_plus") fix before optimising."""
    view, truth = digits_view(batch_size=8, seed=0)
    labels = target_label_sets(
        view.model, matching_target(view), num_classes=10, input_shape=truth.inputs.shape[1:], strategy="llg_plus"
    )[0]
    assert float(label_recovery_accuracy(labels, truth.targets, num_classes=10)) >= 0.875
