r"""2DP-FL: DP-SGD on every client plus independent noise on the global model sent to each client.

Xiong, Cai, Takabi, Li, "Privacy Threat and Defense for Federated Learning with Non-i.i.d. Data in AIoT",
IEEE Transactions on Industrial Informatics 2021, Algorithm 1 ("twice noised" DP-FL): client noise
:math:`\mathcal N(0, (\sigma_k G)^2)` on the sum of per-example clipped gradients (sample-level DP, DP-SGD of
Abadi et al.) and server noise :math:`\mathcal N(0, (\sigma S)^2/U)` added, independently per client, to the
federated model each client downloads.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor
from typing_extensions import override

from lightning_fl.defences.per_example_dp import ClientDPSGD
from lightning_fl.privacy.accounting import AccountantName, calibrate_noise_multiplier
from lightning_fl.privacy.mechanisms import gaussian_noise
from lightning_fl.transforms import BroadcastTransform

if TYPE_CHECKING:
    from lightning_fl.loop import FederatedLoop

__all__ = ["DownlinkNoise", "DualDP", "ServerNoiseMode"]

ServerNoiseMode = Literal["per_client", "shared", "none"]


class DualDP(ClientDPSGD):
    r"""2DP-FL's client side: DP-SGD with flat per-example clipping to G and one Gaussian draw per batch.

    Implements the client loop of Alg. 1 of 2DP-FL (Xiong et al., IEEE TII 2021):
    :math:`\tilde g = \frac{1}{|B|}\big(\sum_{x\in B}\bar g(x) + \mathcal N(0, (\sigma_k G)^2)\big)`.
    The noise multiplier comes from the budget: Inferred (spec B.4, B.10-4), the paper's
    :math:`\sigma = \omega\sqrt{T\log(1/\delta)}/\epsilon` has an unstated :math:`\omega`, so sigma is calibrated with
    the accountant such that every client stays within ``target_epsilon`` after ``loop.num_rounds`` rounds even
    if selected in all of them (sample-level epsilon, q = B/n_k). Pair it with
    :class:`~lightning_fl.callbacks.PrivacyBudget` to stop exactly when the budget is spent when sigma is fixed.
    Pair it with :class:`DownlinkNoise` for the server noise.

    Args:
        target_epsilon: the budget epsilon (paper: 20); ``None`` uses ``noise_multiplier`` as given.
        noise_multiplier: :math:`\sigma_k` when ``target_epsilon`` is ``None``.
        max_grad_norm: per-example clip bound G (Inferred default 1.0, spec B.10-6).
        delta: target delta (paper Fig. 6: 1e-3).
        accountant: ``rdp`` or ``prv``.

    Raises:
        ValueError: if neither or both of ``target_epsilon`` and ``noise_multiplier`` are given.
    """

    def __init__(
        self,
        *,
        target_epsilon: float | None = 20.0,
        noise_multiplier: float | None = None,
        max_grad_norm: float = 1.0,
        delta: float = 1e-3,
        accountant: AccountantName = "rdp",
    ) -> None:
        if (target_epsilon is None) == (noise_multiplier is None):
            raise ValueError(
                f"DualDP(target_epsilon={target_epsilon}, noise_multiplier={noise_multiplier}): give exactly one; "
                "the other follows from the accountant."
            )
        super().__init__(
            noise_multiplier=noise_multiplier or 1.0,
            max_grad_norm=max_grad_norm,
            clipping="flat",
            noise_scaling="per_batch",
            delta=delta,
            accountant=accountant,
        )
        self.target_epsilon = target_epsilon
        self._calibrated = False

    def calibrate(self, loop: FederatedLoop) -> float:
        """Set and return sigma for ``target_epsilon`` over ``loop.num_rounds`` rounds (once; idempotent)."""
        if self.target_epsilon is not None and not self._calibrated:
            pairs = {
                (self._client_sample_rate(loop, k), self._steps_per_round(loop, k) * loop.num_rounds)
                for k in range(loop.num_clients)
            }
            self.dp.noise_multiplier = max(
                calibrate_noise_multiplier(
                    target_epsilon=self.target_epsilon,
                    delta=self.delta,
                    sample_rate=q,
                    steps=steps,
                    accountant=self.accountant_name,
                )
                for q, steps in pairs
            )
            self._calibrated = True
        return self.dp.noise_multiplier

    @override
    def on_fit_start(self, loop: FederatedLoop) -> None:
        self.calibrate(loop)
        super().on_fit_start(loop)

    @override
    def epsilon_projected(self, loop: FederatedLoop) -> float:
        self.calibrate(loop)
        return super().epsilon_projected(loop)


class DownlinkNoise(BroadcastTransform):
    r"""2DP-FL's server noise: :math:`w^k_{t+1} = \dot w^f_{t+1} + \mathcal N(0, (\sigma S)^2/U)` for each client k.

    Implements the download step of Alg. 1 of 2DP-FL (Xiong et al., IEEE TII 2021) with the paper's three
    modes: ``per_client`` (independent noise per client, 2DP-FL), ``shared`` (one draw for all clients in a
    round, "the common method") and ``none``. Noise is added to the model's parameters, not its buffers.
    Inferred (spec B.10-2, B.10-3): S is a server-side sensitivity constant and sigma defaults to the
    clients' DP-SGD multiplier (the :class:`DualDP` in ``loop.callbacks``). With ``accumulate=True`` (the
    paper) the server averages the noisy local models, so the downlink noise stays in the global model
    (see :attr:`~lightning_fl.transforms.BroadcastTransform.persistent`); ``accumulate=False`` measures each
    update against the model its client received and forgets the noise.

    Args:
        sensitivity: S.
        noise_multiplier: :math:`\sigma`; ``None`` takes it from the loop's :class:`ClientDPSGD` callback.
        mode: ``per_client``, ``shared`` or ``none``.
        accumulate: keep the downlink noise in the aggregate (the paper's model averaging).

    Raises:
        ValueError: on a negative sensitivity or an unknown mode; at run time when no sigma can be found.
    """

    def __init__(
        self,
        *,
        sensitivity: float = 0.1,
        noise_multiplier: float | None = None,
        mode: ServerNoiseMode = "per_client",
        accumulate: bool = True,
    ) -> None:
        if sensitivity < 0:
            raise ValueError(f"DownlinkNoise(sensitivity={sensitivity}) must be >= 0.")
        if mode not in ("per_client", "shared", "none"):
            raise ValueError(f"DownlinkNoise(mode={mode!r}) is unknown; use 'per_client', 'shared' or 'none'.")
        self.sensitivity, self.noise_multiplier, self.mode = sensitivity, noise_multiplier, mode
        self.persistent = accumulate

    def _sigma(self, loop: FederatedLoop) -> float:
        if self.noise_multiplier is not None:
            return self.noise_multiplier
        for cb in loop.callbacks:
            if isinstance(cb, DualDP):
                return cb.calibrate(loop)
            if isinstance(cb, ClientDPSGD):
                return cb.noise_multiplier
        raise ValueError("DownlinkNoise(noise_multiplier=None) needs a DualDP (ClientDPSGD) in loop.callbacks.")

    @override
    def __call__(self, state: dict[str, Tensor], *, client_id: int, loop: FederatedLoop) -> dict[str, Tensor]:
        if self.mode == "none":
            return state
        std = self._sigma(loop) * self.sensitivity / math.sqrt(loop.clients_per_round)
        parts = ("downlink", client_id) if self.mode == "per_client" else ("downlink",)
        generator = torch.Generator().manual_seed(loop.round_seed(*parts))
        params = {name for name, _ in loop.global_model.named_parameters()}
        return {
            k: v + gaussian_noise(v, std=std, generator=generator) if k in params and v.is_floating_point() else v
            for k, v in state.items()
        }
