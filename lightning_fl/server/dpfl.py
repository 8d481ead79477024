"""DPFL's global update (Alg. 3, line 9), in the paper's literal form or as plain FedAvg."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_fl.messages import ClientUpdate
from lightning_fl.server.aggregation import Aggregator, weighted_average, weighted_sum

if TYPE_CHECKING:
    from lightning_fl.contexts import RoundContext, SetupContext

__all__ = ["DPFLAggregator", "configured_lr"]


class DPFLAggregator(Aggregator):
    r"""DPFL's aggregation (Zhu et al., IEEE IoT-J 2021, Alg. 3 line 9), faithful or as FedAvg.

    ``form="eta_over_all_samples"`` (default, the formula as printed):
    :math:`w^{(t+1)} = w^{(t)} - \eta\sum_{k\in S^{(t)}} \frac{n_k}{n}\hat{\nabla g}_k^{(t)}` with
    :math:`\hat{\nabla g}_k = w^{(t)} - w_k` (minus the client delta) and :math:`n = \sum_{k=1}^{K} n_k` over *all*
    clients, so each round moves the model by about :math:`\eta\lambda` of a FedAvg step.
    ``form="fedavg"`` (sound): :math:`w^{(t+1)} = w^{(t)} + \sum_{k\in S}\frac{n_k}{\sum_{j\in S} n_j}\Delta_k`.

    Args:
        form: ``eta_over_all_samples`` or ``fedavg``.
        server_lr: :math:`\eta` of the faithful form; ``None`` takes the learning rate the server's own copy of the
            model configures (:func:`configured_lr`, read in :meth:`setup`), never the one a client reports in its
            update's metadata: a client could otherwise set the server's step.

    Raises:
        ValueError: on an unknown form; in :meth:`setup`, when the faithful form has no ``server_lr`` and the
            model configures no optimiser to read it from.
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
        self.eta: float | None = server_lr

    @override
    def setup(self, ctx: SetupContext) -> None:
        self.total_samples = sum(ctx.spec.num_train_samples)
        if self.form == "fedavg" or self.server_lr is not None:
            return
        self.eta = configured_lr(ctx.global_model)
        if self.eta is None:
            raise ValueError(
                f"DPFLAggregator(form='eta_over_all_samples') needs eta, and {type(ctx.global_model).__name__}."
                "configure_optimizers() gives no optimiser to read it from; set DPFLAggregator(server_lr=...)."
            )

    @override
    def aggregate(
        self, updates: Sequence[ClientUpdate], *, ctx: RoundContext | None
    ) -> tuple[dict[str, Tensor], dict[str, float]]:
        if self.form == "fedavg":
            return weighted_average([u.delta for u in updates], [u.num_samples for u in updates]), {}
        eta = self.eta
        if eta is None or self.total_samples <= 0:
            raise ValueError(
                "DPFLAggregator(form='eta_over_all_samples') needs setup(ctx) and eta: set server_lr=... ."
            )
        return weighted_sum([u.delta for u in updates], [eta * u.num_samples / self.total_samples for u in updates]), {}


def configured_lr(model: nn.Module) -> float | None:
    """The learning rate of the first optimiser ``model.configure_optimizers()`` returns, or ``None``.

    It reads the server's own copy of the model's configuration (the clients train with the same one), in every
    form Lightning accepts: an optimiser, a list or tuple of them (with schedulers), or a dict with ``"optimizer"``.

    Example:
        >>> class Net(nn.Linear):
        ...     def configure_optimizers(self):
        ...         return {"optimizer": torch.optim.SGD(self.parameters(), lr=0.05)}
        >>> configured_lr(Net(1, 1))
        0.05
    """
    configure = getattr(model, "configure_optimizers", None)
    if configure is None:
        return None
    try:
        found = configure()
    except Exception:  # a model whose optimiser needs a Trainer attached: no rate to read here
        return None
    while isinstance(found, list | tuple) and found:
        found = found[0]
    if isinstance(found, dict):
        found = found.get("optimizer")
    if not isinstance(found, torch.optim.Optimizer) or not found.param_groups:
        return None
    lr = found.param_groups[0].get("lr")
    return float(lr) if isinstance(lr, int | float | torch.Tensor) else None
