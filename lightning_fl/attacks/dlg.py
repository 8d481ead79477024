"""DLG: Deep Leakage from Gradients (Zhu et al., NeurIPS 2019).

Dummy images and dummy soft labels are optimised jointly with L-BFGS so that their gradient matches the shared
one in squared Euclidean distance (Eq. 4 of the paper). A preset of the shared
:class:`~lightning_fl.attacks.gradient_matching.GradientMatchingAttack`.

References:
    Zhu, Liu, Han. Deep Leakage from Gradients. NeurIPS 2019. https://arxiv.org/abs/1906.08935
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_fl.attacks.gradient_matching import GradientMatchingAttack, InitName

__all__ = ["DLGAttack"]


class DLGAttack(GradientMatchingAttack):
    r"""DLG: :math:`\min_{x', y'} \|\nabla_\theta L(F(x'; \theta), \mathrm{softmax}(y')) - \nabla W\|^2` with L-BFGS.

    Paper defaults (the authors' ``main.py``): dummy data and label logits from N(0, 1), soft-label
    cross-entropy, ``torch.optim.LBFGS(lr=1)`` for 300 ``step()`` calls of up to 20 iterations each.
    Deviation: ``max_iterations`` counts objective evaluations (one L-BFGS iteration each, see
    :class:`~lightning_fl.attacks.batched_lbfgs.BatchedLBFGS`), so the paper's budget is about 6000; the default
    of 1200 is what the sigmoid LeNet needs on a 32x32 digit (see docs/attacks.md). DLG itself has no restarts;
    ``restarts > 1`` runs several seeds in one batched computation and keeps the best (some seeds stall).

    Args:
        max_iterations: L-BFGS iterations (objective evaluations) per restart.
        lr: L-BFGS step size (1 in the paper).
        restarts: random starts run together.
        init: starting images (``randn`` in the paper).
        stop_below: stop once a restart's gradient distance is at most this fraction of ``sum ||g||^2`` (about
            30-40 dB PSNR on the LeNet; docs/attacks.md); ``None`` runs all ``max_iterations``.
        layers: ``fnmatch`` patterns of matched parameters (DPFL's partial-layer attack); ``None``: all.
        progress_bar: show a rich progress bar.
        seed: seed of the dummy data and labels.

    Example:
        >>> attack = DLGAttack(max_iterations=10, progress_bar=False)
        >>> attack.distance, attack.optimizer, attack.labels
        ('euclidean', 'lbfgs', 'optimise')
    """

    name = "dlg"

    def __init__(
        self,
        *,
        max_iterations: int = 2000,
        lr: float = 1.0,
        restarts: int = 2,
        init: InitName = "rand",
        layers: Sequence[str] | None = None,
        stop_below: float | None = 3e-8,
        progress_bar: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(
            distance="euclidean",
            optimizer="lbfgs",
            lr=lr,
            max_iterations=max_iterations,
            restarts=restarts,
            labels="optimise",
            init=init,
            layers=layers,
            stop_below=stop_below,
            progress_bar=progress_bar,
            seed=seed,
        )
