"""DLG: Deep Leakage from Gradients (Zhu et al., NeurIPS 2019).

Dummy images and dummy soft labels are optimised jointly with L-BFGS so that their gradient matches the shared
one in squared Euclidean distance (Eq. 4 of the paper). A preset of the shared
:class:`~lightning_fl.attacks.gradient_matching.GradientMatchingAttack`.

References:
    Zhu, Liu, Han. Deep Leakage from Gradients. NeurIPS 2019. https://arxiv.org/abs/1906.08935
"""

from __future__ import annotations

from lightning_fl.attacks.gradient_matching import GradientMatchingAttack
from lightning_fl.presets import Preset

__all__ = ["DLGAttack"]


class DLGAttack(GradientMatchingAttack):
    r"""DLG: :math:`\min_{x', y'} \|\nabla_\theta L(F(x'; \theta), \mathrm{softmax}(y')) - \nabla W\|^2` with L-BFGS.

    Paper defaults (the authors' ``main.py``): dummy data and label logits from N(0, 1), soft-label
    cross-entropy, ``torch.optim.LBFGS(lr=1)`` for 300 ``step()`` calls of up to 20 iterations each.
    ``max_iterations`` counts objective evaluations (one L-BFGS iteration each, see
    :class:`~lightning_fl.attacks.batched_lbfgs.BatchedLBFGS`), so the paper's budget is about 6000.
    Deviations (measured in docs/attacks.md, "Parity" and "Batch recovery"): the dummy image starts from U(0, 1),
    the range of the images it must become; 4 random starts run batched for ``keep_best_after=100`` iterations,
    then only the one with the smallest gradient distance goes on; the attack stops once the gradient distance is
    below ``stop_below`` times ``sum ||g||^2`` instead of running its whole budget; a restart that L-BFGS threw
    into the sigmoids' saturation (or that diverged) is re-drawn or sent back to its best iterate
    (``recover_stalled``). For a batch (B > 1 images per gradient) the ``"auto"`` defaults add a total-variation
    prior, drop the early stop, run the paper's budget
    (:meth:`~lightning_fl.attacks.gradient_matching.GradientMatchingAttack.batch_settings`) and take the labels
    from ``label_strategy`` instead of optimising them; one image keeps the paper's objective and joint soft
    labels, with the stop and 3000 evaluations.

    Args:
        max_iterations: L-BFGS iterations (objective evaluations) per restart; ``"auto"``: 3000 for one image
            (the early stop ends most runs first) and the paper's 6000 for a batch, which runs without the stop.
        lr: L-BFGS step size (1 in the paper).
        restarts: random starts run together.
        init: starting images (``randn`` in the paper, ``rand`` here).
        labels: ``"optimise"`` joint soft labels (the paper), ``"infer"`` them with ``label_strategy`` first;
            ``"auto"``: optimise for one image, infer for a batch.
        label_strategy: the rule of :func:`~lightning_fl.attacks.labels.infer_labels` for inferred labels
            (default: the bias-gradient counts of Geng et al., 2021).
        stop_below: stop once a restart's gradient distance is at most this fraction of ``sum ||g||^2``; ``None``
            runs all ``max_iterations``; ``"auto"``: 3e-8 for one image, ``None`` for a batch, where half-recovered
            batches already reach that distance.
        keep_best_after: after this many iterations only the restart with the smallest gradient distance goes on;
            ``None`` runs every restart to the end.
        recover_stalled: re-draw a restart whose sigmoids saturated (its gradient is exactly zero far from a
            solution) and send one that diverged after progress back to its best iterate (the paper's loop has
            neither).
        tv_weight: weight of a total-variation prior on the images (not in the paper; 0 is the paper's objective);
            ``"auto"``: 0 for one image, 1e-3 for a batch.
        layers: ``fnmatch`` patterns of matched parameters (DPFL's partial-layer attack); ``None``: all.
        progress_bar: show a rich progress bar.
        seed: seed of the dummy data and labels.

    Example:
        >>> attack = DLGAttack(max_iterations=10, progress_bar=False)
        >>> attack.distance, attack.optimizer, attack.label_mode(1), attack.label_mode(8)
        ('euclidean', 'lbfgs', 'optimise', 'infer')
    """

    name = "dlg"
    preset = Preset(
        pinned={"distance": "euclidean", "optimizer": "lbfgs"},
        defaults={
            "max_iterations": "auto",
            "lr": 1.0,
            "restarts": 4,
            "init": "rand",
            "labels": "auto",
            "label_strategy": "bias_count",
            "layers": None,
            "stop_below": "auto",
            "keep_best_after": 100,
            "recover_stalled": True,
            "tv_weight": "auto",
            "progress_bar": True,
            "seed": 0,
        },
    )
