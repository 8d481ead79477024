r"""Byzantine-robust aggregation: norm bounding, coordinate-wise median, trimmed mean, Krum and Multi-Krum.

The maths are pure functions on lists of deltas (state dicts of tensors, one per client); the aggregators below
convert a round's :class:`~lightning_fl.messages.ClientUpdate` objects and delegate, as Flower's strategies call
``flwr.server.strategy.aggregate``. Each rule reads every client's plaintext values, so none of them can run on
encrypted updates (Paillier, secure aggregation): :func:`~lightning_fl.federation.composition.check_composition`
refuses that combination.

* Krum and Multi-Krum: Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient Descent",
  NeurIPS 2017, Sec. 4 (Krum) and Sec. 5 (Multi-Krum).
* Coordinate-wise median and trimmed mean: Yin et al., "Byzantine-Robust Distributed Learning: Towards Optimal
  Statistical Rates", ICML 2018, Definitions 1 and 2.
* Norm bounding: Sun et al., "Can You Really Backdoor Federated Learning?", arXiv:1911.07963, Sec. 3 (clip each
  update to a bound :math:`M`); here the bound is data-driven, a factor times the median norm of the round.

References:
    https://proceedings.neurips.cc/paper/2017/hash/f4b9ec30ad9f68f89b29639786cb62ef-Abstract.html
    https://proceedings.mlr.press/v80/yin18a.html
    https://arxiv.org/abs/1911.07963
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from typing_extensions import override

from lightning_fl.messages import ClientUpdate
from lightning_fl.server.aggregation import Aggregator, weighted_average

if TYPE_CHECKING:
    from lightning_fl.contexts import RoundContext, SetupContext

__all__ = [
    "CoordinateMedian",
    "Krum",
    "NormBounding",
    "RobustAggregator",
    "TrimmedMean",
    "bound_norms",
    "coordinate_median",
    "krum_scores",
    "multi_krum",
    "trimmed_mean",
    "update_norms",
]

Delta = dict[str, Tensor]


def _check_deltas(deltas: Sequence[Delta]) -> None:
    if not deltas:
        raise ValueError("robust aggregation needs at least one delta.")


def _flat(delta: Delta) -> Tensor:
    return torch.cat([v.detach().reshape(-1).double() for v in delta.values()])


def _median(values: Tensor) -> Tensor:
    """Median along dim 0, the mean of the two middle values for an even count (``numpy.median``'s rule)."""
    ordered = values.sort(dim=0).values
    n = ordered.shape[0]
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


def update_norms(deltas: Sequence[Delta]) -> Tensor:
    r"""The L2 norm :math:`\|\Delta_i\|_2` of each delta over all its tensors, in float64.

    Example:
        >>> update_norms([{"w": torch.tensor([3.0, 4.0])}, {"w": torch.tensor([0.0, 1.0])}])
        tensor([5., 1.], dtype=torch.float64)
    """
    _check_deltas(deltas)
    return torch.stack([_flat(d).norm() for d in deltas])


def bound_norms(deltas: Sequence[Delta], *, factor: float) -> tuple[list[Delta], float]:
    r"""Scale each delta down to the round's bound :math:`M = c \cdot \mathrm{median}_i \|\Delta_i\|_2`.

    Implements the norm clipping of Sun et al. (arXiv:1911.07963, Sec. 3),
    :math:`\Delta_i \leftarrow \Delta_i / \max(1, \|\Delta_i\|_2 / M)`, with a bound taken from the round itself.

    Args:
        deltas: the round's deltas.
        factor: :math:`c`, the bound as a multiple of the median norm; must be >= 1 (below 1 it clips the honest
            majority).

    Returns:
        the bounded deltas and the bound :math:`M`.

    Raises:
        ValueError: if ``factor`` < 1 or there are no deltas.

    Deviation: the paper fixes :math:`M` ahead of training; a fixed bound needs the scale of the honest updates,
    which changes over rounds and models, so the median (robust while fewer than half the clients are faulty) sets it.

    Example:
        >>> bounded, bound = bound_norms([{"w": torch.tensor([1.0])}, {"w": torch.tensor([2.0])},
        ...                               {"w": torch.tensor([100.0])}], factor=2.0)
        >>> [d["w"].item() for d in bounded], bound
        ([1.0, 2.0, 4.0], 4.0)
    """
    if not factor >= 1:
        raise ValueError(f"NormBounding(factor={factor}) must be >= 1: the bound is factor x the median norm.")
    norms = update_norms(deltas)
    bound = float(_median(norms) * factor)
    scales = (bound / norms).clamp(max=1.0).nan_to_num(nan=1.0)  # a zero delta (0/0) stays as it is
    return [{k: v * float(s) for k, v in d.items()} for d, s in zip(deltas, scales, strict=True)], bound


def coordinate_median(deltas: Sequence[Delta]) -> Delta:
    r"""Coordinate-wise median of the deltas (Yin et al., ICML 2018, Definition 1).

    :math:`g_j = \mathrm{med}\{\Delta_{i,j} : i \in [m]\}` for every coordinate :math:`j`; for an even number of
    clients the mean of the two middle values (as ``numpy.median`` and Flower's ``aggregate_median``).

    Example:
        >>> coordinate_median([{"w": torch.tensor([1.0, 9.0])}, {"w": torch.tensor([2.0, 0.0])},
        ...                    {"w": torch.tensor([50.0, 1.0])}])
        {'w': tensor([2., 1.])}
    """
    _check_deltas(deltas)
    return {k: _median(torch.stack([d[k] for d in deltas])) for k in deltas[0]}


def trimmed_mean(deltas: Sequence[Delta], *, beta: float) -> Delta:
    r"""Coordinate-wise :math:`\beta`-trimmed mean (Yin et al., ICML 2018, Definition 2).

    .. math:: g_j = \frac{1}{(1 - 2\beta) m} \sum_{x \in U_j} x

    where :math:`U_j` drops the :math:`\lfloor \beta m \rfloor` largest and smallest values of coordinate
    :math:`j` (Flower's ``aggregate_trimmed_avg``, SciPy's ``trim_mean``).

    Args:
        deltas: the round's deltas (:math:`m` of them).
        beta: the share cut from each end, in [0, 0.5).

    Raises:
        ValueError: if ``beta`` is outside [0, 0.5) or there are no deltas.

    Example:
        >>> trimmed_mean([{"w": torch.tensor([v])} for v in (1.0, 2.0, 3.0, 100.0)], beta=0.25)
        {'w': tensor([2.5000])}
    """
    if not 0 <= beta < 0.5:
        raise ValueError(f"TrimmedMean(beta={beta}) must lie in [0, 0.5): the share cut from each end.")
    _check_deltas(deltas)
    cut = int(beta * len(deltas))
    kept = slice(cut, len(deltas) - cut)
    return {k: torch.stack([d[k] for d in deltas]).sort(dim=0).values[kept].mean(dim=0) for k in deltas[0]}


def krum_scores(deltas: Sequence[Delta], *, num_malicious: int) -> Tensor:
    r"""Krum's score of each delta (Blanchard et al., NeurIPS 2017, Sec. 4).

    :math:`s(i) = \sum_{i \to j} \|V_i - V_j\|^2`, the sum over the :math:`n - f - 2` deltas closest to
    :math:`V_i` (itself excluded); at least one neighbour is used when :math:`n \le f + 2` (as Flower does).

    Args:
        deltas: the round's deltas (:math:`n` of them).
        num_malicious: :math:`f`, the number of Byzantine clients tolerated.

    Example:
        >>> krum_scores([{"w": torch.tensor([v])} for v in (0.0, 1.0, 2.0, 10.0)], num_malicious=1)
        tensor([ 1.,  1.,  1., 64.], dtype=torch.float64)
    """
    _check_deltas(deltas)
    flat = torch.stack([_flat(d) for d in deltas])
    distances = torch.cdist(flat, flat).square()
    closest = max(1, len(deltas) - num_malicious - 2)
    return distances.sort(dim=1).values[:, 1 : closest + 1].sum(dim=1)


def multi_krum(
    deltas: Sequence[Delta], weights: Sequence[float], *, num_malicious: int, to_keep: int
) -> tuple[Delta, list[int]]:
    r"""Multi-Krum (Blanchard et al., NeurIPS 2017, Sec. 5): the weighted average of the ``to_keep`` deltas of
    lowest Krum score (:func:`krum_scores`); ``to_keep=1`` is Krum itself, which returns the chosen delta.

    Args:
        deltas: the round's deltas.
        weights: the averaging weights of the kept deltas (sample counts, as Flower's ``aggregate_krum``).
        num_malicious: :math:`f`.
        to_keep: :math:`m`, how many deltas are averaged; at most ``len(deltas)``.

    Returns:
        the aggregate and the indices of the kept deltas, best score first.

    Example:
        >>> deltas = [{"w": torch.tensor([v])} for v in (0.0, 1.0, 2.0, 10.0)]
        >>> multi_krum(deltas, [1, 1, 1, 1], num_malicious=1, to_keep=2)
        ({'w': tensor([0.5000])}, [0, 1])
    """
    if not to_keep >= 1:
        raise ValueError(f"Krum(to_keep={to_keep}) must be >= 1: the number of updates averaged.")
    scores = krum_scores(deltas, num_malicious=num_malicious)
    kept = torch.argsort(scores, stable=True)[:to_keep].tolist()
    return weighted_average([deltas[i] for i in kept], [weights[i] for i in kept]), kept


class RobustAggregator(Aggregator):
    """An aggregator that reads every client's plaintext update to bound a faulty client's influence.

    It refuses encoded updates (a ``payload``: Paillier ciphertexts): their values are hidden from the server.
    """

    reads_plaintext = True

    def _deltas(self, updates: Sequence[ClientUpdate]) -> list[Delta]:
        if any(u.payload is not None for u in updates):
            raise ValueError(
                f"{type(self).__name__} reads each client's plaintext update but got encrypted ones; use FedAvg "
                "with encryption (SecureFedAvg, SecAggSum) or drop the encryption."
            )
        return [u.delta for u in updates]


class NormBounding(RobustAggregator):
    """FedAvg of updates clipped to ``factor`` x the round's median update norm (see :func:`bound_norms`).

    Args:
        factor: the bound as a multiple of the median L2 norm of the round's updates; >= 1.
        weighted: weight each client by its (client-reported) sample count, as :class:`FedAvg`.

    Example:
        >>> u = [ClientUpdate(k, 0, {"w": torch.tensor([v])}, 1, 0.0) for k, v in enumerate((1.0, 2.0, 100.0))]
        >>> NormBounding(factor=2.0).aggregate(u, ctx=None)
        ({'w': tensor([2.3333])}, {'norm_bound': 4.0, 'clipped_clients': 1.0})
    """

    def __init__(self, *, factor: float = 2.0, weighted: bool = True) -> None:
        bound_norms([{"w": torch.zeros(1)}], factor=factor)  # checks factor
        self.factor, self.weighted = factor, weighted

    @override
    def aggregate(self, updates: Sequence[ClientUpdate], *, ctx: RoundContext | None) -> tuple[Delta, dict]:
        deltas = self._deltas(updates)
        bounded, bound = bound_norms(deltas, factor=self.factor)
        clipped = float((update_norms(deltas) > bound).sum())
        weights = [u.num_samples if self.weighted else 1.0 for u in updates]
        return weighted_average(bounded, weights), {"norm_bound": bound, "clipped_clients": clipped}


class CoordinateMedian(RobustAggregator):
    """Coordinate-wise median of the updates (see :func:`coordinate_median`); sample counts are ignored.

    Example:
        >>> u = [ClientUpdate(k, 0, {"w": torch.tensor([v])}, 1, 0.0) for k, v in enumerate((1.0, 2.0, 100.0))]
        >>> CoordinateMedian().aggregate(u, ctx=None)
        ({'w': tensor([2.])}, {})
    """

    @override
    def aggregate(self, updates: Sequence[ClientUpdate], *, ctx: RoundContext | None) -> tuple[Delta, dict]:
        return coordinate_median(self._deltas(updates)), {}


class TrimmedMean(RobustAggregator):
    """Coordinate-wise trimmed mean of the updates (see :func:`trimmed_mean`); sample counts are ignored.

    Args:
        beta: the share of updates cut from each end of every coordinate, in [0, 0.5). With ``k`` clients a
            round, ``floor(beta * k)`` are cut from each end; set it so that at least one is.

    Example:
        >>> u = [ClientUpdate(k, 0, {"w": torch.tensor([v])}, 1, 0.0) for k, v in enumerate((1.0, 2.0, 3.0, 100.0))]
        >>> TrimmedMean(beta=0.25).aggregate(u, ctx=None)
        ({'w': tensor([2.5000])}, {})
    """

    def __init__(self, *, beta: float = 0.2) -> None:
        trimmed_mean([{"w": torch.zeros(1)}], beta=beta)  # checks beta
        self.beta = beta

    @override
    def setup(self, ctx: SetupContext) -> None:
        k = ctx.spec.clients_per_round
        if int(self.beta * k) < 1:
            raise ValueError(
                f"TrimmedMean(beta={self.beta}) cuts no update of loop.clients_per_round={k}; raise beta to at "
                f"least {1 / k:.3g} (or select more clients a round)."
            )

    @override
    def aggregate(self, updates: Sequence[ClientUpdate], *, ctx: RoundContext | None) -> tuple[Delta, dict]:
        return trimmed_mean(self._deltas(updates), beta=self.beta), {}


class Krum(RobustAggregator):
    """Krum, or Multi-Krum with ``to_keep`` > 1 (see :func:`multi_krum`).

    Args:
        num_malicious: :math:`f`, the faulty clients tolerated a round; Krum needs :math:`n > 2f + 2` clients
            (Blanchard et al., Proposition 1).
        to_keep: :math:`m`, the updates averaged (1: Krum, the one update of lowest score).

    Example:
        >>> u = [ClientUpdate(k, 0, {"w": torch.tensor([v])}, 1, 0.0) for k, v in enumerate((0.0, 1.0, 2.0, 10.0))]
        >>> Krum(num_malicious=1, to_keep=2).aggregate(u, ctx=None)
        ({'w': tensor([0.5000])}, {'krum_kept_clients': 2.0})
    """

    def __init__(self, *, num_malicious: int = 1, to_keep: int = 1) -> None:
        if num_malicious < 0 or to_keep < 1:
            raise ValueError(
                f"Krum(num_malicious={num_malicious}, to_keep={to_keep}): num_malicious must be >= 0 and to_keep >= 1."
            )
        self.num_malicious, self.to_keep = num_malicious, to_keep

    @override
    def setup(self, ctx: SetupContext) -> None:
        k, f = ctx.spec.clients_per_round, self.num_malicious
        if k <= 2 * f + 2 or self.to_keep > k:
            raise ValueError(
                f"Krum(num_malicious={f}, to_keep={self.to_keep}) needs loop.clients_per_round > 2 x num_malicious "
                f"+ 2 = {2 * f + 2} and >= to_keep, got {k}; select more clients a round or lower num_malicious."
            )

    @override
    def aggregate(self, updates: Sequence[ClientUpdate], *, ctx: RoundContext | None) -> tuple[Delta, dict]:
        deltas = self._deltas(updates)
        weights = [float(u.num_samples) for u in updates]
        to_keep = min(self.to_keep, len(deltas))  # fewer clients than selected reached the server
        aggregate, kept = multi_krum(deltas, weights, num_malicious=self.num_malicious, to_keep=to_keep)
        return aggregate, {"krum_kept_clients": float(len(kept))}
