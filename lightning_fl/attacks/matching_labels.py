"""The labels a gradient-matching attack fixes before optimising: inferred from the target, ordered per restart."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lightning_fl.attacks.label_counts import dummy_inputs, dummy_statistics
from lightning_fl.attacks.label_impact import label_impact
from lightning_fl.attacks.labels import (
    COUNT_STRATEGIES,
    LabelStrategy,
    infer_labels,
    last_layer_bias_name,
    last_layer_weight_name,
    sign_search_candidates,
)
from lightning_fl.attacks.local_update import step_positions
from lightning_fl.attacks.targets import MatchingTarget

__all__ = ["restart_label_orders", "target_label_sets"]


def target_label_sets(
    model: nn.Module,
    target: MatchingTarget,
    *,
    num_classes: int,
    input_shape: Sequence[int],
    strategy: LabelStrategy,
    seed: int = 0,
    limit: int = 1,
) -> Tensor:
    """Candidate sets of the ``target.num_images`` labels behind ``target``, ``(n, B)`` with ``n <= limit``, from the
    classifier's pseudo-gradient averaged over the local steps: the one set of
    :func:`~lightning_fl.attacks.labels.infer_labels` (the count rules' dummies drawn from ``seed``), or for
    ``"sign_search"`` the candidates of :func:`~lightning_fl.attacks.labels.sign_search_candidates`.

    ``llg_plus`` measures its impact and offset with the same dummy inputs for every class (the attacker holds the
    model but no data of the task; Wainakh et al. (2022) use auxiliary data, which a caller of
    :func:`~lightning_fl.attacks.labels.infer_labels` can pass instead).

    Raises:
        ValueError: when the classifier weight is not among the matched layers.
    """
    weight = last_layer_weight_name(model, num_classes=num_classes)
    gradients = dict(zip(target.names, target.tensors, strict=True))
    if weight not in gradients:
        raise ValueError(f"inferred labels need the classifier weight {weight!r} among the matched layers.")
    if strategy == "sign_search":
        return sign_search_candidates(gradients[weight] / target.local_steps, num_images=target.num_images, limit=limit)
    bias = last_layer_bias_name(model, weight_name=weight)
    dummy = impact = None
    if strategy in COUNT_STRATEGIES:
        dummy = dummy_statistics(model, classifier_weight=weight, input_shape=input_shape, seed=seed)
    if strategy == "llg_plus":
        dummies = dummy_inputs(64, input_shape=input_shape, seed=seed)
        impact = label_impact(model, classifier_weight=weight, inputs_per_class=[dummies] * num_classes)
    labels = infer_labels(
        gradients[weight] / target.local_steps,
        num_images=target.num_images,
        strategy=strategy,
        bias_gradient=gradients[bias] / target.local_steps if bias in gradients else None,
        dummy=dummy,
        impact=impact,
    )
    return labels[None]


def restart_label_orders(
    label_sets: Tensor,
    *,
    local_steps: int,
    restarts: int,
    generator: torch.Generator,
    data_per_step: int | None = None,
) -> Tensor:
    """Inferred labels per restart ``(R, B)`` from the candidate label sets ``(n, B)`` (most plausible first).

    Inferred: the restarts first try each candidate set (restart 0 the first, in its inferred order); in a
    multi-step update the assignment of a set to the local steps is unknown too (the gradient of one step is
    symmetric in its batch, the steps are not), so further restarts try other assignments: first ones that put other
    labels together in a step (each a new partition of a set into step batches), then other step orders of those,
    drawn from ``generator``; the best restart picks the labels and their assignment. Step t holds the positions
    :func:`~lightning_fl.attacks.local_update.step_positions` names (``data_per_step`` default ``B / local_steps``).

    Example:
        >>> orders = restart_label_orders(torch.tensor([[0, 3, 5, 8]]), local_steps=2, restarts=4,
        ...                               generator=torch.Generator().manual_seed(0))
        >>> sorted({tuple(sorted((tuple(sorted(o[:2].tolist())), tuple(sorted(o[2:].tolist()))))) for o in orders})
        [((0, 3), (5, 8)), ((0, 5), (3, 8)), ((0, 8), (3, 5))]
        >>> restart_label_orders(torch.tensor([[1, 3, 3], [1, 1, 3]]), local_steps=1, restarts=3,
        ...                      generator=torch.Generator()).tolist()
        [[1, 3, 3], [1, 1, 3], [1, 3, 3]]
    """
    sets, count = label_sets.shape
    if local_steps == 1 or restarts == 1:
        return label_sets[torch.arange(restarts) % sets]
    per_step = data_per_step or max(count // local_steps, 1)
    positions = step_positions(count, local_steps=local_steps, data_per_step=per_step)
    candidates = [label_sets[s] for s in range(sets)]
    candidates += [
        label_sets[s][torch.randperm(count, generator=generator)] for _ in range(64 * restarts) for s in range(sets)
    ]
    keys = [tuple(tuple(sorted(labels[p].tolist())) for p in positions) for labels in candidates]
    chosen: list[int] = []
    for new_key in (
        lambda steps: tuple(sorted(sum(steps, ()))),
        lambda steps: tuple(sorted(steps)),
        lambda steps: steps,
        lambda steps: None,
    ):
        seen = {new_key(keys[i]) for i in chosen}
        for index, steps in enumerate(keys):
            key = new_key(steps)
            if len(chosen) < restarts and index not in chosen and (key is None or key not in seen):
                chosen.append(index)
                seen.add(key)
    return torch.stack([candidates[i] for i in chosen])
