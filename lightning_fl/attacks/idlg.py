"""iDLG: Improved Deep Leakage from Gradients (Zhao, Mopuri, Bilen, 2020).

The label is read analytically off the last layer's gradient (Sec. 3.1 of the paper; batch variants in
:func:`~lightning_fl.attacks.labels.infer_labels`), then DLG optimises the image alone with the label fixed.
A preset of the shared :class:`~lightning_fl.attacks.gradient_matching.GradientMatchingAttack`.

References:
    Zhao, Mopuri, Bilen. iDLG: Improved Deep Leakage from Gradients. arXiv:2001.02610, 2020.
"""

from __future__ import annotations

from lightning_fl.attacks.dlg import DLGAttack
from lightning_fl.attacks.gradient_matching import GradientMatchingAttack
from lightning_fl.attacks.labels import infer_labels

__all__ = ["IDLGAttack", "infer_labels"]


class IDLGAttack(GradientMatchingAttack):
    """iDLG: analytic labels, then DLG's Euclidean gradient matching with L-BFGS on the image only.

    Paper defaults as DLG's (L-BFGS lr 1, N(0, 1) dummy data, the DLG LeNet); the paper's label rule holds for
    one image with non-negative penultimate features. Deviations as :class:`~lightning_fl.attacks.DLGAttack`'s:
    U(0, 1) start, 4 restarts of which the best goes on after 100 iterations, early stop at ``stop_below``, and
    for a batch (B > 1) DLG's ``"auto"`` batch settings (a total-variation prior, no early stop, 6000 evaluations).
    For B > 1 (the paper has one image only) the labels come from ``label_strategy``, by default the label counts of
    Geng et al. (2021) from the classifier's bias gradient, which is exact for one image, as the paper's rule is.

    Args:
        max_iterations: L-BFGS iterations (objective evaluations) per restart; ``"auto"``: 3000 for one image
            (the early stop ends most runs first) and the paper's 6000 for a batch, which runs without the stop.
        lr: L-BFGS step size.
        restarts: random starts run together; the best final gradient distance wins.
        label_strategy: a rule of :func:`~lightning_fl.attacks.labels.infer_labels`: ``"bias_count"`` (counts from
            the bias gradient), ``"weight_count"`` (for a classifier without a bias), ``"idlg"`` (the paper's sign
            rule, generalised to the B most negative row sums), ``"yin"`` or ``"llg"``.
        init: starting images.
        stop_below: stop once a restart's gradient distance is at most this fraction of ``sum ||g||^2``; ``None``
            runs all ``max_iterations``; ``"auto"``: 3e-8 for one image, ``None`` for a batch (as
            :class:`~lightning_fl.attacks.dlg.DLGAttack`'s).
        keep_best_after: after this many iterations only the restart with the smallest gradient distance goes on;
            ``None`` runs every restart to the end.
        recover_stalled: re-draw a restart whose sigmoids saturated (its gradient is exactly zero far from a
            solution) and send one that diverged after progress back to its best iterate (the paper's loop has
            neither; docs/attacks.md "Natural photos").
        tv_weight: weight of a total-variation prior on the images (not in the paper; 0 is the paper's objective);
            ``"auto"``: 0 for one image, 1e-3 for a batch (as :class:`~lightning_fl.attacks.dlg.DLGAttack`'s).
        layers: ``fnmatch`` patterns of matched parameters; ``None``: all (the classifier weight must be among them).
        progress_bar: show a rich progress bar.
        seed: seed of the dummy data.

    Example:
        >>> IDLGAttack(max_iterations=10).labels
        'infer'
    """

    name = "idlg"
    preset = DLGAttack.preset.derive(pinned={"labels": "infer"})
