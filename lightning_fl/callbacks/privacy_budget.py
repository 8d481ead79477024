"""Stop federated training before a privacy budget epsilon would be exceeded."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_fl.callbacks.base import FederatedCallback

if TYPE_CHECKING:
    from lightning_fl.view import FederationView, LedgerReading

__all__ = ["PrivacyBudget"]

log = logging.getLogger(__name__)


class PrivacyBudget(FederatedCallback):
    r"""Stop the loop so that the spent epsilon never exceeds ``target_epsilon``.

    After each round it asks every privacy-spending component of the loop (each
    :class:`~lightning_fl.privacy.PrivacyLedger`: :class:`~lightning_fl.defences.FedCDP`,
    :class:`~lightning_fl.defences.FedSDP`, :class:`~lightning_fl.defences.PoGZNoise`, ...) what one more round
    would cost, in the worst case (every client selected), and stops the loop (``federation.request_stop``) when that
    would exceed the budget: training stops when the budget is spent, never after, as 2DP-FL requires
    (Xiong et al., IEEE TII 2021, Fig. 6(b)). Several ledgers compose by basic composition (their epsilons add).
    The stop reason is logged and written to ``summary.json["stop_reason"]``.

    Args:
        target_epsilon: the budget.

    Raises:
        ValueError: if ``target_epsilon`` is not a finite number > 0; before anything is written (``check_fit``)
            if not even the next round fits in the budget. A loop with no ledger is refused when it is built
            (:func:`~lightning_fl.federation.composition.check_budget_has_ledger`).

    Example:
        >>> PrivacyBudget(target_epsilon=20.0).target_epsilon
        20.0
    """

    needs_privacy_ledger = True

    def __init__(self, target_epsilon: float) -> None:
        if not (0 < target_epsilon < math.inf):
            raise ValueError(f"PrivacyBudget(target_epsilon={target_epsilon}) must be a finite number > 0.")
        self.target_epsilon = float(target_epsilon)
        self.stopped_at: int | None = None

    @staticmethod
    def ledgers(federation: FederationView) -> list[LedgerReading]:
        """What the run's privacy-spending parts report."""
        return list(federation.ledgers())

    @override
    def check_fit(self, federation: FederationView) -> None:
        ledgers = self.ledgers(federation)
        projected = sum(ledger.epsilon_projected(federation.spec) for ledger in ledgers)
        if federation.round_idx < federation.num_rounds and projected > self.target_epsilon:
            spent = sum(ledger.epsilon_spent() for ledger in ledgers)
            raise ValueError(
                f"PrivacyBudget(target_epsilon={self.target_epsilon}): round {federation.round_idx} would bring the "
                f"cumulative epsilon from {spent:.4g} to {projected:.4g}; raise the budget or the noise "
                "(a resumed run counts every round since its start)."
            )

    @override
    def on_round_end(self, federation: FederationView, round_idx: int, metrics: dict[str, Any]) -> None:
        should_stop, reason = self._evaluate_stopping_criteria(federation, round_idx)
        if should_stop:
            self.stopped_at = round_idx
            log.warning(reason)
            federation.request_stop(reason)

    def _evaluate_stopping_criteria(self, federation: FederationView, round_idx: int) -> tuple[bool, str]:
        if round_idx + 1 >= federation.num_rounds:
            return False, ""
        ledgers = self.ledgers(federation)
        spent = sum(ledger.epsilon_spent() for ledger in ledgers)
        projected = sum(ledger.epsilon_projected(federation.spec) for ledger in ledgers)
        if projected <= self.target_epsilon:
            return False, ""
        return True, (
            f"privacy budget reached: epsilon={spent:.4g} spent after round {round_idx} and round {round_idx + 1} "
            f"would reach {projected:.4g} > target_epsilon={self.target_epsilon}"
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"stopped_at": self.stopped_at}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stopped_at = state["stopped_at"]
