r"""FedBoosting: aggregation weights from each client model's training loss and cross-validation losses.

Implements FedBoosting of the thesis (Ren, "Gradient Leakage and Protection for Federated Learning",
Swansea 2023, Ch. 4; Ren et al., "FedBoosting: Federated Learning with Gradient Protected Boosting for Text
Recognition"), Algorithms 2-3: each client model :math:`i` is evaluated on every client :math:`j`'s
validation set (:math:`V^{i,j}`, Eq. 4.3), its training loss :math:`T^i` is reported, and the global update
is :math:`G = \sum_i p^i G^i` (Eq. 4.1) with weights from :math:`T` and :math:`V`:

* ``weighting="inverse_losses"`` (default): the formula of the authors' code (``process_client_test_result``),
  :math:`a_i = \frac{1}{\mathrm{mean}_j V^{i,j}} \cdot \frac{1/T_i}{\sum_k 1/T_k}`, :math:`p = a / \sum_k a_k`.
* ``weighting="softmax_losses"``: Eq. 4.2 read literally, :math:`p = \mathrm{softmax}(\mathrm{softmax}(T) \odot V)`
  with :math:`V_i = \sum_j V^{i,j}`. On losses this gives *more* weight to models with higher training and
  validation loss, against the thesis' own narrative (a poisoned model with worse validation scores gets a
  lower weight); the authors' code inverts the losses.
* ``weighting="accuracies"``: the same code with ``FL_STRATEGY_METRICS="acc"``,
  :math:`a_i = \mathrm{mean}_j A^{i,j} \cdot \frac{A_i}{\sum_k A_k}` on accuracies. Bounded, so on label-skewed
  clients it does not collapse onto one client as the inverse losses do (docs/reproduction.md).
* ``weighting="inverse_val_losses"``: :math:`a_i = 1 / \mathrm{mean}_j V^{i,j}`, the "validation results only"
  ablation of the thesis' Fig. 4.6.

With Paillier (:class:`~lightning_fl.defences.secure_aggregation.protocol.PaillierEncryption` on the clients), the
weights become integers by splitting into :math:`P` pieces, :math:`G^* = \sum_i \lfloor p^i P \rfloor g^{*i}`
(Eq. 4.4), and the decrypted sum is divided by :math:`P`. The "DP" fusion (Sec. 4.2.3, Eq. 4.5) shares each
client model for cross-validation only as a linear combination dominated by itself,
:math:`\hat G^{*i} = \lfloor \hat p P \rfloor g^{*i} + \sum_{j \ne i} \lfloor (1-\hat p) P / (N-1) \rfloor g^{*j}`.
It is not differential privacy (no noise, no epsilon); the name follows the thesis.

Inferred: with client sampling, cross-validation runs among the clients selected in the round (the thesis
trains every client every round). The simulation decrypts each shared model once and evaluates it on every
selected client's validation set; in a deployment each client decrypts its own copy (same plaintext).
Clients decode the shared models through the client transforms' ``decode_aggregate``, as they decode the aggregate,
so the cross-validation downloads count in ``he_download_bytes``; a client's own model, evaluated for its training
loss, is no download (the client holds it in plaintext).
Deviation: without HE the weights stay real numbers (Eq. 4.1); the P-piece integer split applies to
ciphertexts only, where it is needed.

References:
    https://github.com/Rand2AI/FedBoosting (reference code, read for the weighting formula only)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor
from typing_extensions import override

from lightning_fl.messages import ClientUpdate
from lightning_fl.server.encrypted import EncryptedAggregate, PaillierAggregator, check_payloads, combine_updates

if TYPE_CHECKING:
    from lightning_fl.contexts import ClientEvaluationStep, ClientSetupContext, RoundContext, SetupContext

__all__ = [
    "WEIGHTINGS",
    "FedBoosting",
    "accuracy_weights",
    "eq_4_2_weights",
    "fusion_weights",
    "integer_weights",
    "reference_weights",
    "validation_only_weights",
]

WeightingName = Literal["inverse_losses", "accuracies", "inverse_val_losses", "softmax_losses"]
RoundingName = Literal["floor", "round", "largest_remainder"]
TrainLossSource = Literal["after_training", "epoch_mean"]


def _check_losses(train_losses: Tensor, cross_val_losses: Tensor) -> None:
    n = train_losses.numel()
    if train_losses.shape != (n,) or cross_val_losses.shape != (n, n):
        raise ValueError(
            f"train_losses must have shape (N,) and cross_val_losses (N, N); got {tuple(train_losses.shape)} "
            f"and {tuple(cross_val_losses.shape)}."
        )
    if not (torch.isfinite(train_losses).all() and torch.isfinite(cross_val_losses).all()):
        raise ValueError("FedBoosting losses must be finite; a client model diverged (lower its learning rate).")


def reference_weights(*, train_losses: Tensor, cross_val_losses: Tensor) -> Tensor:
    r"""FedBoosting weights of the authors' code: inverse mean cross-validation loss times normalised inverse
    training loss.

    .. math::
        a_i = \frac{1}{\mathrm{mean}_j V^{i,j}} \cdot \frac{1/T_i}{\sum_k 1/T_k}, \qquad p_i = a_i / \sum_k a_k

    Args:
        train_losses: :math:`T`, shape ``(N,)``, each > 0.
        cross_val_losses: :math:`V`, shape ``(N, N)``; row :math:`i` is model :math:`i` on every client's
            validation set (diagonal included), each > 0.

    Raises:
        ValueError: on wrong shapes, or non-finite or non-positive losses.

    Example:
        >>> reference_weights(train_losses=torch.tensor([1.0, 2.0]),
        ...                   cross_val_losses=torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        tensor([0.8235, 0.1765])
    """
    _check_losses(train_losses, cross_val_losses)
    if (train_losses <= 0).any() or (cross_val_losses <= 0).any():
        raise ValueError("weighting='inverse_losses' inverts losses, so all must be > 0.")
    inverse_train = 1.0 / train_losses
    scores = (1.0 / cross_val_losses.mean(dim=1)) * (inverse_train / inverse_train.sum())
    return scores / scores.sum()


def eq_4_2_weights(*, train_losses: Tensor, cross_val_losses: Tensor) -> Tensor:
    r"""FedBoosting weights of the thesis' Eq. 4.2 taken literally (on losses).

    .. math::
        p = \mathrm{softmax}\big(\mathrm{softmax}(T) \odot V\big), \qquad V_i = \sum_j V^{i,j}

    Args:
        train_losses: :math:`T`, shape ``(N,)``.
        cross_val_losses: :math:`V^{i,j}`, shape ``(N, N)``.

    Raises:
        ValueError: on wrong shapes or non-finite losses.

    Example:
        >>> eq_4_2_weights(train_losses=torch.tensor([1.0, 2.0]),
        ...                cross_val_losses=torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        tensor([0.0132, 0.9868])
    """
    _check_losses(train_losses, cross_val_losses)
    return torch.softmax(torch.softmax(train_losses, dim=0) * cross_val_losses.sum(dim=1), dim=0)


def accuracy_weights(*, train_scores: Tensor, cross_val_scores: Tensor) -> Tensor:
    r"""FedBoosting weights of the authors' code with ``FL_STRATEGY_METRICS="acc"``: mean cross-validation
    accuracy times normalised training accuracy.

    .. math::
        a_i = \mathrm{mean}_j A^{i,j} \cdot \frac{A_i}{\sum_k A_k}, \qquad p_i = a_i / \sum_k a_k

    Accuracies are bounded in :math:`[0, 1]`, so no client can take more than
    :math:`1 / (1 + (N-1)\,a_{\min}/a_{\max})` of the update; inverse losses are unbounded and, on label-skewed
    clients, let the client with the easiest local task take almost all of it (docs/reproduction.md).

    Args:
        train_scores: :math:`A_i`, each client model's accuracy on its own training data, shape ``(N,)``.
        cross_val_scores: :math:`A^{i,j}`, model :math:`i` on client :math:`j`'s validation set, shape ``(N, N)``.

    Raises:
        ValueError: on wrong shapes, non-finite values, or accuracies outside :math:`[0, 1]` or all zero.

    Example:
        >>> accuracy_weights(train_scores=torch.tensor([1.0, 0.5]),
        ...                  cross_val_scores=torch.tensor([[0.5, 0.7], [0.9, 0.9]]))
        tensor([0.5714, 0.4286])
    """
    _check_losses(train_scores, cross_val_scores)
    if (
        (train_scores < 0).any()
        or (train_scores > 1).any()
        or (cross_val_scores < 0).any()
        or (cross_val_scores > 1).any()
    ):
        raise ValueError("weighting='accuracies' needs accuracies in [0, 1]; check FedBoosting(val_accuracy_metric).")
    scores = cross_val_scores.mean(dim=1) * (train_scores / train_scores.sum().clamp_min(1e-12))
    if scores.sum() <= 0:
        raise ValueError("weighting='accuracies' got zero accuracy for every client model; no weight can be formed.")
    return scores / scores.sum()


def validation_only_weights(*, train_losses: Tensor, cross_val_losses: Tensor) -> Tensor:
    r"""FedBoosting weights from the cross-validation losses alone (thesis Sec. 4.3.2.3, Fig. 4.6 dashed lines:
    "aggregated only with validation results").

    .. math::
        a_i = \frac{1}{\mathrm{mean}_j V^{i,j}}, \qquad p_i = a_i / \sum_k a_k

    ``train_losses`` is checked but unused: dropping the training factor is the point of this ablation.

    Example:
        >>> validation_only_weights(train_losses=torch.tensor([1.0, 2.0]),
        ...                         cross_val_losses=torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        tensor([0.7000, 0.3000])
    """
    _check_losses(train_losses, cross_val_losses)
    if (cross_val_losses <= 0).any():
        raise ValueError("weighting='inverse_val_losses' inverts losses, so all must be > 0.")
    scores = 1.0 / cross_val_losses.mean(dim=1)
    return scores / scores.sum()


def _accuracy_weights(*, train_losses: Tensor, cross_val_losses: Tensor) -> Tensor:
    return accuracy_weights(train_scores=train_losses, cross_val_scores=cross_val_losses)


WEIGHTINGS: dict[str, Callable[..., Tensor]] = {
    "inverse_losses": reference_weights,
    "accuracies": _accuracy_weights,
    "inverse_val_losses": validation_only_weights,
    "softmax_losses": eq_4_2_weights,
}
"""Weighting name -> function of ``(train_losses=, cross_val_losses=)``; ``"accuracies"`` receives accuracies there."""

# floating point puts (1 - 0.9) * 100 / 2 at 4.999...; the thesis' floor means 5
_FLOOR_TOLERANCE = 1e-9


def _floor(value: float) -> int:
    return math.floor(value + _FLOOR_TOLERANCE)


def integer_weights(weights: Tensor, *, pieces: int, rounding: RoundingName = "floor") -> list[int]:
    r"""Split weights :math:`p \in [0, 1]` into integer numbers of :math:`P` pieces for Paillier (Eq. 4.4).

    ``floor`` is the thesis' :math:`\lfloor p P \rfloor` (the sum may fall below :math:`P`, which shrinks
    the update slightly), ``round`` the reference code, ``largest_remainder`` floors and hands the missing
    pieces to the largest remainders so the weights sum to exactly :math:`P` (Hamilton's apportionment method).

    Example:
        >>> p = torch.tensor([0.455, 0.545])
        >>> [integer_weights(p, pieces=10, rounding=r) for r in ("floor", "round", "largest_remainder")]
        [[4, 5], [5, 5], [5, 5]]
    """
    if rounding not in ("floor", "round", "largest_remainder"):
        raise ValueError(f"rounding={rounding!r} is unknown; use 'floor', 'round' or 'largest_remainder'.")
    if pieces < 1:
        raise ValueError(f"pieces={pieces} must be >= 1.")
    scaled = weights.double() * pieces
    if rounding == "round":
        return [int(v) for v in torch.round(scaled).tolist()]
    floors = torch.floor(scaled + _FLOOR_TOLERANCE)
    result = [int(v) for v in floors.tolist()]
    if rounding == "largest_remainder":
        missing = pieces - sum(result)
        for index in torch.argsort(scaled - floors, descending=True, stable=True)[: max(missing, 0)].tolist():
            result[index] += 1
    return result


def fusion_weights(p_hat: Sequence[float], *, pieces: int) -> list[list[int]]:
    r"""Integer fusion weights of Eq. 4.5: row :math:`i` builds the model shared in place of client :math:`i`'s.

    Row :math:`i` has :math:`\lfloor \hat p_i P \rfloor` on the diagonal and
    :math:`\lfloor (1 - \hat p_i) P / (N - 1) \rfloor` elsewhere.

    Example:
        >>> fusion_weights([0.9, 0.9, 0.9], pieces=100)
        [[90, 5, 5], [5, 90, 5], [5, 5, 90]]
    """
    n = len(p_hat)
    if n == 1:
        return [[pieces]]
    rows = []
    for i, p in enumerate(p_hat):
        own, other = _floor(p * pieces), _floor((1.0 - p) * pieces / (n - 1))
        rows.append([own if j == i else other for j in range(n)])
    return rows


class FedBoosting(PaillierAggregator):
    """FedBoosting aggregation (thesis Ch. 4, Algorithm 2), in plaintext or on Paillier ciphertexts.

    Each round: every selected client's model (or, with fusion, the Eq. 4.5 mix dominated by it) is
    evaluated on every selected client's validation set; the weights come from these losses and the
    training losses (``weighting``); the global update is their weighted sum (Eq. 4.1, or Eq. 4.4 on
    ciphertexts). The weights of the last round are in :attr:`last_weights` and in the history
    (``fedboosting_weight_<client>``, with the scores they came from: ``fedboosting_train_score_<client>``, the
    training loss or accuracy, and ``fedboosting_val_score_<client>``, the mean cross-validation loss or accuracy).

    Args:
        weighting: ``"inverse_losses"`` (the authors' code with its default ``FL_STRATEGY_METRICS="loss"``;
            default), ``"accuracies"`` (the authors' code with ``"acc"``: bounded weights, the reading that keeps
            up with FedAvg on label-skewed clients), ``"inverse_val_losses"`` (cross-validation only, the thesis'
            Fig. 4.6 ablation) or ``"softmax_losses"`` (the thesis' Eq. 4.2 literally).
        train_loss: ``"after_training"`` evaluates each client's trained model on its training set (thesis
            Algorithm 3, line 19); ``"epoch_mean"`` uses the mean loss of the last local epoch (the code).
        pieces: :math:`P`, the number of pieces the Paillier weights are split into (thesis: 100).
        rounding: how :math:`p P` becomes an integer: ``floor`` (thesis), ``round`` (code) or
            ``largest_remainder`` (sums to exactly :math:`P`).
        fusion_p_hat: :math:`\\hat p` of the "DP" fusion (Eq. 4.5; thesis 0.9); ``None`` shares the raw client
            models for cross-validation. Must exceed :math:`1/N` so that each client's model dominates its mix.
        fusion_p_hat_min: if set, each client's :math:`\\hat p` is drawn afresh every round from
            :math:`U(\\text{fusion\\_p\\_hat\\_min}, \\text{fusion\\_p\\_hat})` (the thesis' "randomly generates N
            sets of private fusing weights"); it must also exceed :math:`1/N`.
        val_metric: the loss the model logs in ``validation_step``.
        val_accuracy_metric: the accuracy the model logs in ``validation_step`` (``weighting="accuracies"``).

    Raises:
        ValueError: on unknown option names or out-of-range numbers; at setup, on clients without a
            validation set, or fusion weights that cannot make each model dominant or mix in nothing.

    Example:
        >>> FedBoosting(weighting="softmax_losses", fusion_p_hat=0.9).pieces
        100
    """

    def __init__(
        self,
        *,
        weighting: WeightingName = "inverse_losses",
        train_loss: TrainLossSource = "after_training",
        pieces: int = 100,
        rounding: RoundingName = "floor",
        fusion_p_hat: float | None = None,
        fusion_p_hat_min: float | None = None,
        val_metric: str = "val_loss",
        val_accuracy_metric: str = "val_acc",
    ) -> None:
        if weighting not in WEIGHTINGS:
            raise ValueError(f"FedBoosting(weighting={weighting!r}) is unknown; use one of {sorted(WEIGHTINGS)}.")
        if train_loss not in ("after_training", "epoch_mean"):
            raise ValueError(
                f"FedBoosting(train_loss={train_loss!r}) is unknown; use 'after_training' or 'epoch_mean'."
            )
        if weighting == "accuracies" and train_loss == "epoch_mean":
            raise ValueError(
                "FedBoosting(weighting='accuracies') needs train_loss='after_training': clients report no "
                "training accuracy, so it is measured on each client's training set after local training."
            )
        if rounding not in ("floor", "round", "largest_remainder"):
            raise ValueError(
                f"FedBoosting(rounding={rounding!r}) is unknown; use 'floor', 'round' or 'largest_remainder'."
            )
        if pieces < 1:
            raise ValueError(f"FedBoosting(pieces={pieces}) must be >= 1 (the thesis uses 100).")
        if fusion_p_hat is not None and not 0.0 < fusion_p_hat <= 1.0:
            raise ValueError(f"FedBoosting(fusion_p_hat={fusion_p_hat}) must be in (0, 1] (the thesis uses 0.9).")
        if fusion_p_hat_min is not None and (fusion_p_hat is None or not 0.0 < fusion_p_hat_min < fusion_p_hat):
            raise ValueError(
                f"FedBoosting(fusion_p_hat_min={fusion_p_hat_min}) needs fusion_p_hat set and 0 < min < fusion_p_hat."
            )
        self.weighting, self.train_loss, self.pieces, self.rounding = weighting, train_loss, pieces, rounding
        self.fusion_p_hat, self.fusion_p_hat_min, self.val_metric = fusion_p_hat, fusion_p_hat_min, val_metric
        self.val_accuracy_metric = val_accuracy_metric
        self.last_weights: dict[int, float] = {}
        self._clients: ClientEvaluationStep | None = None

    # -- setup -----------------------------------------------------------------------------------------
    @override
    def setup(self, ctx: SetupContext) -> None:
        self._check_fusion(ctx.spec.clients_per_round)
        self._clients = ctx.client_evaluation

    def setup_clients(self, ctx: ClientSetupContext) -> None:
        """Client side, before the first round: every client must hold a validation split to cross-validate on.

        Raises:
            ValueError: naming the clients without one and the setting that gives them one.
        """
        empty = [k for k, val in enumerate(ctx.val_sets) if len(val) == 0]
        if empty:
            raise ValueError(
                f"FedBoosting needs a validation set on every client, but clients {empty[:5]} have none; "
                "raise data.val_fraction."
            )

    def _check_fusion(self, num_clients: int) -> None:
        if self.fusion_p_hat is None or num_clients == 1:
            return
        low = self.fusion_p_hat if self.fusion_p_hat_min is None else self.fusion_p_hat_min
        if low <= 1.0 / num_clients:
            raise ValueError(
                f"FedBoosting fusion p_hat={low} must exceed 1/N = {1.0 / num_clients:.3f} (N = clients per round) "
                "so that each client's own model takes the largest share (Eq. 4.5)."
            )
        other = fusion_weights([self.fusion_p_hat] * num_clients, pieces=self.pieces)[0][1]
        if self.fusion_p_hat < 1.0 and other == 0:
            raise ValueError(
                f"FedBoosting(pieces={self.pieces}) makes the fusion weight of the other clients "
                f"floor((1 - {self.fusion_p_hat}) * {self.pieces} / {num_clients - 1}) = 0, so the fusion would "
                "share each model unmixed; raise pieces."
            )

    @override
    def max_weight_sum(self, ctx: SetupContext) -> int:
        # floor and largest_remainder sum to at most P; round adds at most 1/2 per client; fusion rows <= P
        return self.pieces + ctx.spec.clients_per_round

    # -- one round -------------------------------------------------------------------------------------
    @override
    def aggregate(
        self, updates: Sequence[ClientUpdate], *, ctx: RoundContext
    ) -> tuple[dict[str, Tensor] | EncryptedAggregate, dict[str, float]]:
        if self._clients is None:
            raise RuntimeError("FedBoosting has no link to the clients; FederatedLoop.fit() calls setup(ctx) first.")
        global_state = dict(ctx.global_state)
        check_payloads(updates, global_state=global_state)
        start = time.perf_counter()
        ids = [u.client_id for u in updates]
        shared = self._shared_models(updates, ctx)
        cross_val = torch.tensor([self._losses(m, ctx=ctx, client_ids=ids, split="val") for m in shared])
        train = torch.tensor(self._train_losses(updates, ctx))
        weights = WEIGHTINGS[self.weighting](train_losses=train, cross_val_losses=cross_val)
        self.last_weights = dict(zip(ids, weights.tolist(), strict=True))
        if updates[0].payload is None:
            aggregate = combine_updates(updates, weights=weights.tolist(), normaliser=1.0)
        else:
            integers = integer_weights(weights, pieces=self.pieces, rounding=self.rounding)
            aggregate = combine_updates(updates, weights=integers, normaliser=self.pieces)
        metrics = {
            "fedboosting_s": time.perf_counter() - start,
            **{f"fedboosting_weight_{k}": w for k, w in self.last_weights.items()},
            **{f"fedboosting_train_score_{k}": t for k, t in zip(ids, train.tolist(), strict=True)},
            **{f"fedboosting_val_score_{k}": v for k, v in zip(ids, cross_val.mean(dim=1).tolist(), strict=True)},
        }
        return aggregate, metrics

    def _shared_models(
        self, updates: Sequence[ClientUpdate], ctx: RoundContext
    ) -> list[dict[str, Tensor] | EncryptedAggregate]:
        """What is sent around for cross-validation: raw client models, or their Eq. 4.5 fusions."""
        if self.fusion_p_hat is None:
            return [_as_message(u) for u in updates]
        p_hat = [self.fusion_p_hat] * len(updates)
        if self.fusion_p_hat_min is not None:
            generator = ctx.rng("fusion")
            low, high = self.fusion_p_hat_min, self.fusion_p_hat
            p_hat = (low + (high - low) * torch.rand(len(updates), generator=generator, dtype=torch.float64)).tolist()
        return [
            combine_updates(updates, weights=row, normaliser=self.pieces)
            for row in fusion_weights(p_hat, pieces=self.pieces)
        ]

    def _losses(self, message: Any, *, ctx: RoundContext, client_ids: list[int], split: str) -> list[float]:
        """The declared evaluation step: the clients decode ``message`` through their client transforms (their own
        key) and return losses (accuracies with ``weighting="accuracies"``)."""
        by_accuracy = self.weighting == "accuracies"
        return self._clients.losses(
            message,
            ctx=ctx,
            client_ids=client_ids,
            split=split,
            metric=self.val_accuracy_metric if by_accuracy else self.val_metric,
            source=self,
            field="FedBoosting(val_accuracy_metric)" if by_accuracy else "FedBoosting(val_metric)",
        )

    def _train_losses(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> list[float]:
        if self.train_loss == "epoch_mean":
            return [u.loss for u in updates]
        return [self._losses(_as_message(u), ctx=ctx, client_ids=[u.client_id], split="train")[0] for u in updates]


def _as_message(update: ClientUpdate) -> dict[str, Tensor] | EncryptedAggregate:
    """A client's own model as the server can forward it: its plaintext delta, or its ciphertexts."""
    if update.payload is None:
        return update.delta
    return EncryptedAggregate(update.payload, dict(update.delta), sender=update.client_id)
