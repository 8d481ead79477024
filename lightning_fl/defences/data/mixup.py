"""MixUp as a defence: each training example mixed with k - 1 others of the client's data, with soft labels.

References:
    Zhang, Cisse, Dauphin, Lopez-Paz, "mixup: Beyond Empirical Risk Minimization", ICLR 2018, Eq. (1).
    As a defence against gradient inversion: Huang, Gupta, Song, Li, Arora, "Evaluating Gradient Inversion Attacks
    and Defenses in Federated Learning" (GradAttack), NeurIPS 2021, Sec. 5.
"""

from __future__ import annotations

import torch
from torch import Tensor
from typing_extensions import override

from lightning_fl.defences.data.mixing import MixingDefence

__all__ = ["MixUp"]


class MixUp(MixingDefence):
    r"""MixUp (Zhang et al., ICLR 2018, Eq. 1) generalised to ``k`` examples, as GradAttack uses it as a defence.

    Each training example :math:`x_{i1}` is replaced by :math:`\sum_{j=1}^k \lambda_{ij} x_{ij}` with ``k - 1``
    partners drawn from the client's training set, and its label by :math:`\sum_j \lambda_{ij}\,
    \mathrm{onehot}(y_{ij})`. The weights are drawn from :math:`\mathrm{Dirichlet}(\alpha, \ldots, \alpha)`, which
    for ``k = 2`` is the paper's :math:`\lambda \sim \mathrm{Beta}(\alpha, \alpha)`; ``alpha=None`` gives equal
    weights :math:`1/k`. A Lightning callback: ``Trainer(callbacks=[MixUp(k=4)])`` in plain Lightning,
    ``defences=[MixUp(k=4)]`` in a federated run. Only the training batches are mixed.

    Args:
        k: examples per mixture (GradAttack's strength knob; it uses 4); 1 turns the defence off.
        alpha: Dirichlet concentration (> 0); 1 draws the weights uniformly from the simplex; ``None``: equal.
        num_classes: width of the soft labels; ``None`` reads ``pl_module.num_classes``.
        seed: seeds the partners and weights.

    Raises:
        ValueError: if ``k < 1`` or ``alpha <= 0``.

    Example:
        >>> import lightning as L
        >>> mixup = MixUp(k=4, alpha=1.0)
        >>> trainer = L.Trainer(callbacks=[mixup], logger=False, enable_checkpointing=False)
        >>> torch.allclose(mixup.coefficients(2, torch.Generator().manual_seed(0)).sum(dim=1), torch.ones(2))
        True
    """

    def __init__(self, *, k: int = 4, alpha: float | None = 1.0, num_classes: int | None = None, seed: int = 0) -> None:
        super().__init__(k=k, num_classes=num_classes, seed=seed)
        if alpha is not None and not alpha > 0:
            raise ValueError(f"MixUp(alpha={alpha}) must be > 0 (the Dirichlet concentration), or None for 1/k.")
        self.alpha = alpha

    @override
    def coefficients(self, rows: int, generator: torch.Generator) -> Tensor:
        if self.alpha is None:
            return torch.full((rows, self.k), 1.0 / self.k)
        gammas = torch._standard_gamma(torch.full((rows, self.k), float(self.alpha)), generator=generator)
        return gammas / gammas.sum(dim=1, keepdim=True)

    def __repr__(self) -> str:
        return f"MixUp(k={self.k}, alpha={self.alpha})"
