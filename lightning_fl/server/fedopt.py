r"""Server optimisers: FedAvgM, FedAdagrad, FedAdam, FedYogi (Reddi et al., ICLR 2021, Alg. 2).

Adaptive Federated Optimization treats the round's average client change as a pseudo-gradient and feeds it to a
server optimiser. With :math:`\Delta_t = \sum_k \frac{n_k}{n}\Delta_t^k` (FedAvg of the client deltas):

.. math::

    m_t = \beta_1 m_{t-1} + (1-\beta_1)\Delta_t, \qquad x_{t+1} = x_t + \eta\,\frac{m_t}{\sqrt{v_t} + \tau}

with :math:`v_t = v_{t-1} + \Delta_t^2` (FedAdagrad), :math:`v_t = \beta_2 v_{t-1} + (1-\beta_2)\Delta_t^2` (FedAdam)
or :math:`v_t = v_{t-1} - (1-\beta_2)\Delta_t^2\,\mathrm{sign}(v_{t-1} - \Delta_t^2)` (FedYogi). FedAvgM (Hsu et al.,
2019) is server SGD with heavy-ball momentum on the same pseudo-gradient. The client learning rate
:math:`\eta_l` of the paper is the client model's own optimiser setting.

References:
    Reddi et al., "Adaptive Federated Optimization", ICLR 2021, arXiv:2003.00295. Hsu et al., "Measuring the
    Effects of Non-Identical Data Distribution for Federated Visual Classification", arXiv:1909.06335.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor
from typing_extensions import override

from lightning_fl.messages import ClientUpdate
from lightning_fl.presets import Preset
from lightning_fl.server.aggregation import Aggregator, weighted_average

if TYPE_CHECKING:
    from lightning_fl.contexts import RoundContext

__all__ = ["FedAdagrad", "FedAdam", "FedAvgM", "FedYogi", "ServerOptimizer"]


class ServerOptimizer(Aggregator):
    """An aggregator that averages the client deltas (FedAvg) and turns the average into a server optimiser step.

    Subclasses implement :meth:`step` on the pseudo-gradient; the state they keep across rounds (momentum,
    second moments) is saved in the round checkpoint through :meth:`state_dict`.

    Args:
        weighted: weight each client's delta by its sample count :math:`n_k` (FedAvg) or not.

    Raises:
        ValueError: at aggregation, on an encrypted update (the server optimiser needs the plaintext average).
    """

    def __init__(self, *, weighted: bool = True) -> None:
        self.weighted = weighted
        self.moments: dict[str, dict[str, Tensor]] = {}

    @override
    def aggregate(
        self, updates: Sequence[ClientUpdate], *, ctx: RoundContext | None
    ) -> tuple[dict[str, Tensor], dict[str, float]]:
        if any(u.payload is not None for u in updates):
            raise ValueError(
                f"{type(self).__name__} needs plaintext updates to take its step; it cannot follow an encrypting "
                "client transform (Paillier, masking): use FedAvg/SecureFedAvg there."
            )
        weights = [u.num_samples if self.weighted else 1.0 for u in updates]
        pseudo_gradient = weighted_average([u.delta for u in updates], weights)
        step = {key: self.step(key, delta.double()).to(delta.dtype) for key, delta in pseudo_gradient.items()}
        return step, {"server_step_norm": float(torch.sqrt(sum((s.double() ** 2).sum() for s in step.values())))}

    @abstractmethod
    def step(self, key: str, delta: Tensor) -> Tensor:
        """The change of state ``key`` for the pseudo-gradient ``delta`` (float64), updating the moments."""

    def _moment(self, name: str, key: str, like: Tensor, initial: float = 0.0) -> Tensor:
        return self.moments.setdefault(name, {}).get(key, torch.full_like(like, initial))

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"moments": {name: dict(values) for name, values in self.moments.items()}}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.moments = {name: dict(values) for name, values in state["moments"].items()}


class FedAvgM(ServerOptimizer):
    r"""FedAvg with server momentum (Hsu et al., 2019; the FedAvgM baseline of Reddi et al., ICLR 2021).

    :math:`u_t = \beta u_{t-1} + \Delta_t`, :math:`x_{t+1} = x_t + \eta\,u_t` (heavy-ball SGD on the pseudo-gradient
    :math:`-\Delta_t`, as ``torch.optim.SGD`` writes momentum and Flower's ``FedAvgM`` computes it).

    Args:
        server_lr: :math:`\eta` (Flower's ``server_learning_rate``; 1 with momentum 0 is FedAvg).
        server_momentum: :math:`\beta`; Hsu et al. use 0.9 (Flower's default 0 is FedAvg).
        weighted: weight clients by sample count.

    Raises:
        ValueError: on a non-positive ``server_lr`` or a momentum outside [0, 1).

    Example:
        >>> u = [ClientUpdate(0, 0, {"w": torch.tensor([1.0])}, 1, 0.0)]
        >>> opt = FedAvgM(server_lr=1.0, server_momentum=0.5)
        >>> opt.aggregate(u, ctx=None)[0], opt.aggregate(u, ctx=None)[0]
        ({'w': tensor([1.])}, {'w': tensor([1.5000])})
    """

    def __init__(self, *, server_lr: float = 1.0, server_momentum: float = 0.9, weighted: bool = True) -> None:
        if server_lr <= 0:
            raise ValueError(f"FedAvgM(server_lr={server_lr}) must be > 0; 1.0 is FedAvg's step.")
        if not 0 <= server_momentum < 1:
            raise ValueError(f"FedAvgM(server_momentum={server_momentum}) must be in [0, 1); Hsu et al. use 0.9.")
        super().__init__(weighted=weighted)
        self.server_lr, self.server_momentum = server_lr, server_momentum

    @override
    def step(self, key: str, delta: Tensor) -> Tensor:
        velocity = self.server_momentum * self._moment("velocity", key, delta) + delta
        self.moments["velocity"][key] = velocity
        return self.server_lr * velocity


class _AdaptiveServerOptimizer(ServerOptimizer):
    r"""Alg. 2 of Reddi et al.: first moment, a second-moment rule of the subclass, step :math:`\eta m/(\sqrt v+\tau)`.

    Inferred: :math:`v_{-1}` = ``initial_accumulator`` (0 by default, as Flower; Alg. 2 asks
    :math:`v_{-1} \ge \tau^2`, which only matters while :math:`\Delta_t^2` is of the order of :math:`\tau^2`).

    A subclass is the rule :meth:`second_moment` and a :class:`~lightning_fl.presets.Preset` of this constructor's
    arguments (its defaults); its ``__init__`` is made from that declaration.
    """

    preset: ClassVar[Preset | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("preset") is not None:
            cls.__init__ = cls.preset.constructor(_AdaptiveServerOptimizer.__init__, owner=cls)

    def __init__(
        self, *, eta: float, beta_1: float, beta_2: float, tau: float, initial_accumulator: float, weighted: bool
    ) -> None:
        name = type(self).__name__
        if eta <= 0:
            raise ValueError(f"{name}(eta={eta}) must be > 0; it is the server learning rate.")
        if tau <= 0:
            raise ValueError(f"{name}(tau={tau}) must be > 0; it is the adaptivity constant of Alg. 2.")
        for field, value in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not 0 <= value < 1:
                raise ValueError(f"{name}({field}={value}) must be in [0, 1).")
        if initial_accumulator < 0:
            raise ValueError(f"{name}(initial_accumulator={initial_accumulator}) must be >= 0.")
        super().__init__(weighted=weighted)
        self.eta, self.beta_1, self.beta_2, self.tau = eta, beta_1, beta_2, tau
        self.initial_accumulator = initial_accumulator

    @override
    def step(self, key: str, delta: Tensor) -> Tensor:
        first = self.beta_1 * self._moment("m", key, delta) + (1 - self.beta_1) * delta
        second = self.second_moment(self._moment("v", key, delta, self.initial_accumulator), delta)
        self.moments["m"][key], self.moments["v"][key] = first, second
        return self.eta * first / (second.sqrt() + self.tau)

    @abstractmethod
    def second_moment(self, v: Tensor, delta: Tensor) -> Tensor:
        """:math:`v_t` from :math:`v_{t-1}` and :math:`\\Delta_t`."""


class FedAdagrad(_AdaptiveServerOptimizer):
    r"""FedAdagrad (Reddi et al., ICLR 2021, Alg. 2): :math:`v_t = v_{t-1} + \Delta_t^2`.

    Args:
        eta: server learning rate :math:`\eta` (Flower's default 0.1).
        beta_1: momentum :math:`\beta_1`; 0 as Flower's ``FedAdagrad`` (Adagrad has no momentum).
        tau: adaptivity :math:`\tau` (Flower's default 1e-9).
        initial_accumulator: :math:`v_{-1}`.
        weighted: weight clients by sample count.

    Example:
        >>> u = [ClientUpdate(0, 0, {"w": torch.tensor([0.5])}, 1, 0.0)]
        >>> FedAdagrad(eta=0.1).aggregate(u, ctx=None)[0]
        {'w': tensor([0.1000])}
    """

    preset = Preset(
        pinned={"beta_2": 0.0},
        defaults={"eta": 0.1, "beta_1": 0.0, "tau": 1e-9, "initial_accumulator": 0.0, "weighted": True},
    )

    @override
    def second_moment(self, v: Tensor, delta: Tensor) -> Tensor:
        return v + delta**2


class FedAdam(_AdaptiveServerOptimizer):
    r"""FedAdam (Reddi et al., ICLR 2021, Alg. 2): :math:`v_t = \beta_2 v_{t-1} + (1-\beta_2)\Delta_t^2`.

    Deviation from Flower: Flower's ``FedAdam`` also multiplies :math:`\eta` by Adam's bias correction
    :math:`\sqrt{1-\beta_2^{r+1}}/(1-\beta_1^{r+1})` in round r; Alg. 2 has none, and neither has this class.

    Args:
        eta: server learning rate :math:`\eta` (Flower's default 0.1).
        beta_1: :math:`\beta_1` (0.9, the paper's experiments and Flower).
        beta_2: :math:`\beta_2` (0.99, the paper's experiments and Flower).
        tau: adaptivity :math:`\tau` (Flower's default 1e-9; the paper tunes it in 1e-10..1).
        initial_accumulator: :math:`v_{-1}`.
        weighted: weight clients by sample count.

    Example:
        >>> u = [ClientUpdate(0, 0, {"w": torch.tensor([0.5])}, 1, 0.0)]
        >>> FedAdam(eta=0.1).aggregate(u, ctx=None)[0]
        {'w': tensor([0.1000])}
    """

    preset = Preset(
        defaults={"eta": 0.1, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-9, "initial_accumulator": 0.0, "weighted": True}
    )

    @override
    def second_moment(self, v: Tensor, delta: Tensor) -> Tensor:
        return self.beta_2 * v + (1 - self.beta_2) * delta**2


class FedYogi(_AdaptiveServerOptimizer):
    r"""FedYogi (Reddi et al., ICLR 2021, Alg. 2): Yogi's additive second moment.

    :math:`v_t = v_{t-1} - (1-\beta_2)\Delta_t^2\,\mathrm{sign}(v_{t-1}-\Delta_t^2)`.

    Args:
        eta: server learning rate :math:`\eta` (Flower's default 0.01).
        beta_1: :math:`\beta_1` (0.9).
        beta_2: :math:`\beta_2` (0.99).
        tau: adaptivity :math:`\tau` (Flower's default 1e-3 for Yogi).
        initial_accumulator: :math:`v_{-1}`.
        weighted: weight clients by sample count.

    Example:
        >>> u = [ClientUpdate(0, 0, {"w": torch.tensor([0.5])}, 1, 0.0)]
        >>> FedYogi(eta=0.01, tau=1e-9).aggregate(u, ctx=None)[0]
        {'w': tensor([0.0100])}
    """

    preset = FedAdam.preset.derive(defaults={"eta": 0.01, "tau": 1e-3})

    @override
    def second_moment(self, v: Tensor, delta: Tensor) -> Tensor:
        square = delta**2
        return v - (1 - self.beta_2) * square * torch.sign(v - square)
