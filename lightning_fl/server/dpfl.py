"""DPFL's global update (Alg. 3, line 9), in the paper's literal form or as plain FedAvg."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from torch import Tensor
from typing_extensions import override

from lightning_fl.messages import ClientUpdate
from lightning_fl.server.aggregation import Aggregator, weighted_average, weighted_sum

if TYPE_CHECKING:
    from lightning_fl.contexts import RoundContext, SetupContext

__all__ = ["DPFLAggregator"]


class DPFLAggregator(Aggregator):
    r"""DPFL's aggregation (Zhu et al., IEEE IoT-J 2021, Alg. 3 line 9), faithful or as FedAvg.

    ``form="eta_over_all_samples"`` (default, the formula as printed):
    :math:`w^{(t+1)} = w^{(t)} - \eta\sum_{k\in S^{(t)}} \frac{n_k}{n}\hat{\nabla g}_k^{(t)}` with
    :math:`\hat{\nabla g}_k = w^{(t)} - w_k` (minus the client delta) and :math:`n = \sum_{k=1}^{K} n_k` over *all*
    clients, so each round moves the model by about :math:`\eta\lambda` of a FedAvg step.
    ``form="fedavg"`` (sound): :math:`w^{(t+1)} = w^{(t)} + \sum_{k\in S}\frac{n_k}{\sum_{j\in S} n_j}\Delta_k`.

    Args:
        form: ``eta_over_all_samples`` or ``fedavg``.
        server_lr: :math:`\eta` of the faithful form; ``None`` takes the clients' learning rate from the updates.

    Raises:
        ValueError: on an unknown form.
    """

    def __init__(
        self,
        *,
        form: Literal["eta_over_all_samples", "fedavg"] = "eta_over_all_samples",
        server_lr: float | None = None,
    ) -> None:
        if form not in ("eta_over_all_samples", "fedavg"):
            raise ValueError(f"DPFLAggregator(form={form!r}) is unknown; use 'eta_over_all_samples' or 'fedavg'.")
        self.form, self.server_lr = form, server_lr
        self.total_samples = 0

    @override
    def setup(self, ctx: SetupContext) -> None:
        self.total_samples = sum(ctx.spec.num_train_samples)

    @override
    def aggregate(
        self, updates: Sequence[ClientUpdate], *, ctx: RoundContext | None
    ) -> tuple[dict[str, Tensor], dict[str, float]]:
        if self.form == "fedavg":
            return weighted_average([u.delta for u in updates], [u.num_samples for u in updates]), {}
        eta = self.server_lr if self.server_lr is not None else updates[0].metadata.get("lr")
        if eta is None or self.total_samples <= 0:
            raise ValueError(
                "DPFLAggregator(form='eta_over_all_samples') needs setup(ctx) and eta: set server_lr=... ."
            )
        return weighted_sum([u.delta for u in updates], [eta * u.num_samples / self.total_samples for u in updates]), {}
