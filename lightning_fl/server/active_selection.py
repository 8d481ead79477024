"""Active client selection (DPFL Alg. 1, after Goetz et al.'s Active Federated Learning, 2019)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from typing_extensions import override

from lightning_fl.messages import ClientUpdate
from lightning_fl.server.selection import ClientSelector, uniform_sample

if TYPE_CHECKING:
    from lightning_fl.contexts import FederationSpec, RoundContext, SetupContext

__all__ = ["ActiveSelector"]


class ActiveSelector(ClientSelector):
    r"""Select clients by a loss-based valuation, with softmax sampling and some uniform exploration.

    Implements Alg. 1 of DPFL (Zhu et al., IEEE IoT-J 2021): the :math:`\alpha_1 K` clients with the smallest
    valuation :math:`v_k` are excluded (:math:`v_k \leftarrow -\infty`), :math:`(1-\alpha_3)m` clients are drawn
    with probability :math:`\propto e^{\alpha_2 v_k}` (without replacement, Inferred) and :math:`\alpha_3 m`
    uniformly from the rest. The valuation is :math:`v_k = \frac{n_k}{n}\,\mathrm{Loss}_k` (Alg. 3, line 8), with
    n the samples of all K clients; clients not selected keep their stale value. Round 0 (no valuations yet)
    selects uniformly, as the paper says.

    ``loss_form="sum_over_steps"`` uses Alg. 2's Loss: the sum of batch-mean losses over all local steps divided by
    the local sample count; the loop reports the mean loss of the last local epoch, so this is approximated by
    ``loss * local_steps / n_k`` (Inferred). ``"mean"`` uses the mean loss itself (sound).

    Args:
        alpha1: share of clients (by smallest valuation) excluded from the softmax draw (AFL default 0.75).
        alpha2: softmax inverse temperature (AFL default 0.01).
        alpha3: share of the m slots filled uniformly at random (AFL default 0.1).
        unseen: valuation of never-selected clients: ``max`` (the current largest, Inferred default) or ``zero``.
        loss_form: ``sum_over_steps`` or ``mean`` (above).

    Raises:
        ValueError: on alphas outside [0, 1] (alpha2 must be >= 0) or an unknown option.

    Example:
        >>> from lightning_fl.contexts import FederationSpec, RoundContext
        >>> spec = FederationSpec(num_clients=10, clients_per_round=3, num_rounds=2, local_epochs=1,
        ...                       local_steps=None, seed=0, batch_size=8, num_train_samples=(8,) * 10)
        >>> ActiveSelector().select(RoundContext(spec, round_idx=0))  # no valuations yet: uniform
        [0, 1, 6]
    """

    def __init__(
        self,
        *,
        alpha1: float = 0.75,
        alpha2: float = 0.01,
        alpha3: float = 0.1,
        unseen: Literal["max", "zero"] = "max",
        loss_form: Literal["sum_over_steps", "mean"] = "sum_over_steps",
    ) -> None:
        if not (0 <= alpha1 < 1 and 0 <= alpha3 <= 1 and alpha2 >= 0):
            raise ValueError(
                f"ActiveSelector(alpha1={alpha1}, alpha2={alpha2}, alpha3={alpha3}): need 0 <= alpha1 < 1, "
                "alpha2 >= 0 and 0 <= alpha3 <= 1."
            )
        if unseen not in ("max", "zero"):
            raise ValueError(f"ActiveSelector(unseen={unseen!r}) is unknown; use 'max' or 'zero'.")
        if loss_form not in ("sum_over_steps", "mean"):
            raise ValueError(f"ActiveSelector(loss_form={loss_form!r}) is unknown; use 'sum_over_steps' or 'mean'.")
        self.alpha1, self.alpha2, self.alpha3 = alpha1, alpha2, alpha3
        self.unseen, self.loss_form = unseen, loss_form
        self.values: dict[int, float] = {}
        self.total_samples = 0
        self.spec: FederationSpec | None = None

    @override
    def setup(self, ctx: SetupContext) -> None:
        self.total_samples = sum(ctx.spec.num_train_samples)
        self.spec = ctx.spec  # each client's local steps come from here, never from what the client reports

    @override
    def observe(self, updates: Sequence[ClientUpdate]) -> None:
        for u in updates:
            if not math.isfinite(u.loss):
                continue
            loss = u.loss
            if self.loss_form == "sum_over_steps":
                steps = self.spec.steps_per_round(u.client_id) if self.spec is not None else 1
                loss = u.loss * steps / u.num_samples
            self.values[u.client_id] = u.num_samples / max(self.total_samples, 1) * loss

    def valuations(self, num_clients: int) -> torch.Tensor:
        """Current :math:`v_k` of every client, never-selected ones filled per ``unseen``."""
        fill = max(self.values.values()) if self.unseen == "max" else 0.0
        return torch.tensor([self.values.get(k, fill) for k in range(num_clients)], dtype=torch.float64)

    @override
    def select(self, ctx: RoundContext) -> list[int]:
        num_clients, k, generator = ctx.spec.num_clients, ctx.spec.clients_per_round, ctx.rng("select")
        if not self.values:
            return uniform_sample(num_clients, k, generator)
        values = self.valuations(num_clients)
        num_excluded = min(int(self.alpha1 * num_clients), num_clients - k)
        logits = self.alpha2 * values
        logits[torch.argsort(values, stable=True)[:num_excluded]] = -math.inf
        num_soft = int((1 - self.alpha3) * k)
        probs = torch.softmax(logits, dim=0)
        chosen = torch.multinomial(probs, num_soft, replacement=False, generator=generator).tolist()
        rest = [c for c in range(num_clients) if c not in set(chosen)]
        order = torch.randperm(len(rest), generator=generator)[: k - num_soft].tolist()
        return sorted(chosen + [rest[i] for i in order])

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"values": {int(k): float(v) for k, v in self.values.items()}}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.values = {int(k): float(v) for k, v in state["values"].items()}
