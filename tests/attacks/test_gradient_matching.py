"""The shared engine: targets from views, multi-step updates, layer subsets, argument checks."""

from __future__ import annotations

import pytest
import torch

from lightning_fl.attacks import (
    DLGAttack,
    GradientMatchingAttack,
    InvertingGradientsAttack,
    Reconstruction,
    leaked_batch_size,
)
from lightning_fl.attacks.gradient_matching import matching_target, restart_consensus
from lightning_fl.attacks.metrics import score_reconstruction
from lightning_fl.attacks.restart_recovery import RestartRecovery
from lightning_fl.messages import ServerView
from tests.attacks.views import digits_view


def test_attack_on_a_two_step_update_simulates_the_local_steps() -> None:
    view, truth = digits_view(batch_size=1, local_steps=2, image_size=16)
    assert view.kind == "update" and leaked_batch_size(view) == 2
    # iDLG's row-sum rule: on this victim the counts of the bias gradient miss a label of the 2-step update (the model
    # moves between steps; docs/attacks.md "Label inference"), and this test is about the simulated steps
    attack = InvertingGradientsAttack(max_iterations=300, restarts=2, label_strategy="idlg", progress_bar=False)
    reconstruction = attack.reconstruct(view)
    assert reconstruction.images.shape == truth.inputs.shape
    attacked = score_reconstruction(reconstruction, truth, num_classes=10)
    noise = Reconstruction(torch.rand(truth.inputs.shape, generator=torch.Generator().manual_seed(0)), None)
    assert attacked["psnr"] >= score_reconstruction(noise, truth)["psnr"] + 10.0


def test_matching_target_turns_an_update_into_a_pseudo_gradient() -> None:
    view, _ = digits_view(batch_size=2, local_steps=1)
    update = ServerView(
        "client_update",
        view.model,
        {k: -0.1 * v for k, v in view.tensors.items()},
        "update",
        {**view.metadata, "lr": 0.1, "local_steps": 1},
    )
    target = matching_target(update, layers=["*fc.*"])
    assert target.names == ("backbone.fc.weight", "backbone.fc.bias")
    assert torch.allclose(target.tensors[0], view.tensors["backbone.fc.weight"])


def test_matching_target_warns_that_an_adam_update_is_simulated_as_sgd() -> None:
    view, _ = digits_view(batch_size=1)
    adam = ServerView(
        "client_update", view.model, view.tensors, "update", {**view.metadata, "lr": 0.1, "optimizer": "adam"}
    )
    with pytest.warns(UserWarning, match="'adam' optimiser but the attack simulates plain SGD"):
        matching_target(adam)


@pytest.mark.parametrize(
    ("metadata", "match"),
    [({"lr": None}, r"needs the client's metadata\['lr'\]"), ({"batch_size": None}, r"no metadata\['batch_size'\]")],
)
def test_matching_target_names_missing_metadata(metadata: dict, match: str) -> None:
    view, _ = digits_view(batch_size=1)
    broken = ServerView("client_update", view.model, view.tensors, "update", {**view.metadata, **metadata})
    with pytest.raises(ValueError, match=match):
        matching_target(broken)


def test_matching_target_rejects_layer_patterns_that_match_nothing() -> None:
    view, _ = digits_view(batch_size=1)
    with pytest.raises(ValueError, match=r"selected by layers=\['nothing\*'\]"):
        matching_target(view, layers=["nothing*"])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"distance": "l1"}, r"distance='l1'\) is unknown"),
        ({"optimizer": "sgd"}, r"optimizer='sgd'\) is unknown"),
        ({"label_strategy": "dlg"}, r"label_strategy='dlg'\) is unknown"),
        ({"restarts": 0}, r"restarts=0\) must be > 0"),
        ({"max_iterations": -1}, r"max_iterations=-1\) must be > 0"),
    ],
)
def test_gradient_matching_attack_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GradientMatchingAttack(**kwargs)


def test_stop_below_ends_on_the_first_restart_to_match_and_keeps_it() -> None:
    view, _ = digits_view(batch_size=1, image_size=16)
    attack = DLGAttack(max_iterations=800, restarts=2, stop_below=1e-4, keep_best_after=None, progress_bar=False)
    reconstruction = attack.reconstruct(view)
    assert reconstruction.info["converged"] and reconstruction.info["iterations"] < 800
    assert reconstruction.info["relative_gap"] <= 1e-4


def test_keep_best_after_continues_only_the_best_restart() -> None:
    view, _ = digits_view(batch_size=1, image_size=16)
    attack = DLGAttack(max_iterations=12, restarts=3, stop_below=None, keep_best_after=5, progress_bar=False)
    states = list(attack.iterate(view))
    assert [len(s.restart_ids) for s in states] == [3] * 5 + [1] * 7
    best = int(states[4].relative_gaps.argmin())
    assert int(states[-1].restart_ids[0]) == best
    reconstruction = attack.reconstruct(view)
    assert reconstruction.info["best_restart"] == best and len(reconstruction.loss_history) == 12
    with pytest.raises(ValueError, match="keep_best_after"):
        GradientMatchingAttack(optimizer="adam", keep_best_after=5)


def test_recovery_sends_a_diverged_restart_back_and_redraws_a_saturated_one() -> None:
    """The rule of ``recover_stalled``: row 0 diverged after progress (back to its best iterate), row 1 has a
    zero gradient far from any solution (re-drawn), row 2 is fine (untouched); both lost rows' L-BFGS history is
    cleared."""
    images = torch.zeros(3, 2)
    recovery = RestartRecovery([images], vanished=1e-7)
    recovery.record(torch.tensor([1e-4, 0.9, 0.5]), [images])
    images += torch.tensor([[5.0], [7.0], [9.0]])
    cleared = []
    recovery.recover(
        torch.tensor([5.0, 0.9, 0.4]),
        [torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])],
        [images],
        redraw=lambda count: [torch.full((count, 2), -1.0)],
        reset=cleared.append,
    )
    assert images.tolist() == [[0.0, 0.0], [-1.0, -1.0], [9.0, 9.0]]
    assert cleared[0].tolist() == [True, True, False]
    assert recovery.best[1] == torch.inf


def test_consensus_returns_the_mean_of_the_restarts_best_iterates() -> None:
    view, _ = digits_view(batch_size=1, image_size=16)
    settings = {"max_iterations": 20, "restarts": 3, "progress_bar": False}
    states = list(InvertingGradientsAttack(**settings).iterate(view))
    reconstruction = InvertingGradientsAttack(**settings, consensus=True).reconstruct(view)
    expected = states[-1].best_images.clamp(0, 1).mean(0)
    assert torch.allclose(reconstruction.images, expected)
    assert reconstruction.info["output"] == "consensus"
    assert not torch.allclose(reconstruction.images, states[-1].best_images[0].clamp(0, 1))


def test_consensus_puts_each_restarts_batch_in_the_best_restarts_order() -> None:
    images = torch.rand(2, 3, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    swapped = torch.stack([images[0], images[0][[2, 0, 1]] * 0.9])  # restart 1: restart 0's images, reordered
    expected = (images[0] + images[0] * 0.9) / 2
    assert torch.allclose(restart_consensus(swapped, best=0), expected)
    assert torch.allclose(restart_consensus(swapped, best=0, among=torch.tensor([True, False])), images[0])


def test_consensus_leaves_out_restarts_given_another_assignment_of_labels_to_local_steps() -> None:
    # two steps of two digits (labels inferred for a batch): the restarts try other splits of the labels into steps
    multi_step, _ = digits_view(batch_size=2, local_steps=2, image_size=16, distinct_labels=True)
    settings = {"max_iterations": 3, "restarts": 3, "progress_bar": False}
    final = list(InvertingGradientsAttack(**settings).iterate(multi_step))[-1]
    best = int(final.best_losses.argmin())
    same = (final.best_labels == final.best_labels[best]).all(-1)
    assert same.tolist().count(True) == 1
    images = InvertingGradientsAttack(**settings, consensus=True).reconstruct(multi_step).images
    assert torch.allclose(images, restart_consensus(final.best_images, best=best, among=same))
    assert not torch.allclose(images, restart_consensus(final.best_images, best=best))


def test_settle_labels_after_moves_every_restart_onto_the_best_assignment_and_redraws_the_others() -> None:
    multi_step, _ = digits_view(batch_size=2, local_steps=2, image_size=16, distinct_labels=True)
    settings = {"max_iterations": 6, "restarts": 3, "progress_bar": False}
    plain = list(InvertingGradientsAttack(**settings).iterate(multi_step))
    settled = list(InvertingGradientsAttack(**settings, settle_labels_after=3).iterate(multi_step))
    winner = int(plain[2].best_losses.argmin())
    assert [len({tuple(o.tolist()) for o in s.labels}) for s in settled] == [3, 3, 3, 1, 1, 1]
    assert torch.equal(settled[-1].labels[0], plain[2].labels[winner])
    others = [r for r in range(3) if r != winner]
    # the winner went on from its iterate; the others start again from fresh images, with a fresh record
    assert torch.allclose(settled[3].losses[winner], plain[3].losses[winner])
    assert not torch.allclose(settled[3].losses[others], plain[3].losses[others])
    assert torch.equal(settled[3].best_losses[others], settled[3].losses[others])


def test_settle_labels_after_changes_nothing_where_every_restart_has_the_same_labels() -> None:
    view, _ = digits_view(batch_size=2, image_size=16)
    settings = {"max_iterations": 6, "restarts": 2, "progress_bar": False}
    plain = InvertingGradientsAttack(**settings).reconstruct(view)
    settled = InvertingGradientsAttack(**settings, settle_labels_after=3).reconstruct(view)
    assert torch.equal(plain.images, settled.images)
    for settle in (0, 300):
        with pytest.raises(ValueError, match="settle_labels_after"):
            GradientMatchingAttack(settle_labels_after=settle, max_iterations=300)
