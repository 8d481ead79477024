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

from torch import Tensor
from typing_extensions import override

from lightning_fl.defences.base import Defence, DefenceParts
from lightning_fl.defences.dp.per_example_dp import ClientDPSGD, Sampling
from lightning_fl.privacy.accounting import AccountantName, calibrate_noise_multiplier
from lightning_fl.privacy.mechanisms import gaussian_noise
from lightning_fl.transforms import BroadcastTransform
from lightning_fl.validation import check_non_negative, check_positive

if TYPE_CHECKING:
    from lightning_fl.contexts import FederationSpec, RoundContext, SetupContext
    from lightning_fl.view import FederationView

__all__ = ["DownlinkNoise", "DualDP", "DualDPFL", "ServerNoiseMode"]

ServerNoiseMode = Literal["per_client", "shared", "none"]


class DualDP(ClientDPSGD):
    r"""2DP-FL's client side: DP-SGD with flat per-example clipping to G and one Gaussian draw per batch.

    Implements the client loop of Alg. 1 of 2DP-FL (Xiong et al., IEEE TII 2021):
    :math:`\tilde g = \frac{1}{|B|}\big(\sum_{x\in B}\bar g(x) + \mathcal N(0, (\sigma_k G)^2)\big)`.
    The noise multiplier comes from the budget: Inferred, the paper's
    :math:`\sigma = \omega\sqrt{T\log(1/\delta)}/\epsilon` has an unstated :math:`\omega`, so sigma is calibrated with
    the accountant such that every client stays within ``target_epsilon`` after ``federation.num_rounds`` rounds even
    if selected in all of them (sample-level epsilon, q = B/n_k). Pair it with
    :class:`~lightning_fl.callbacks.PrivacyBudget` to stop exactly when the budget is spent when sigma is fixed.
    Pair it with :class:`DownlinkNoise` for the server noise.

    Args:
        target_epsilon: the budget epsilon (paper: 20); ``None`` uses ``noise_multiplier`` as given.
        noise_multiplier: :math:`\sigma_k` when ``target_epsilon`` is ``None``.
        max_grad_norm: per-example clip bound G (Inferred default 1.0).
        delta: target delta (paper Fig. 6: 1e-3).
        accountant: ``rdp`` or ``prv``.
        sampling: ``poisson`` (default, what the accountant assumes) or ``shuffled_batches`` (fixed batches of B;
            see :class:`~lightning_fl.defences.PerExampleDP`).

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
        sampling: Sampling = "poisson",
    ) -> None:
        if (target_epsilon is None) == (noise_multiplier is None):
            raise ValueError(
                f"DualDP(target_epsilon={target_epsilon}, noise_multiplier={noise_multiplier}): give exactly one; "
                "the other follows from the accountant."
            )
        if target_epsilon is not None:
            check_positive(target_epsilon, owner="DualDP", name="target_epsilon", hint="; it is the privacy budget")
        super().__init__(
            noise_multiplier=noise_multiplier or 1.0,
            max_grad_norm=max_grad_norm,
            clipping="flat",
            noise_scaling="per_batch",
            delta=delta,
            accountant=accountant,
            sampling=sampling,
        )
        self.target_epsilon = target_epsilon
        self._calibrated = False

    def calibrate(self, spec: FederationSpec) -> float:
        """Set and return sigma for ``target_epsilon`` over ``spec.num_rounds`` rounds (once; idempotent)."""
        if self.target_epsilon is not None and not self._calibrated:
            pairs = {(spec.sample_rate(k), spec.steps_per_round(k) * spec.num_rounds) for k in range(spec.num_clients)}
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
    def on_fit_start(self, federation: FederationView) -> None:
        self.calibrate(federation.spec)
        super().on_fit_start(federation)
        if federation.round_idx < federation.num_rounds:
            self.check_budget(federation.spec, federation.round_idx)

    @override
    def on_round_start(self, federation: FederationView, round_idx: int, selected: list[int]) -> None:
        self.check_budget(federation.spec, round_idx)
        super().on_round_start(federation, round_idx, selected)

    def check_budget(self, spec: FederationSpec, round_idx: int) -> None:
        """Refuse to start round ``round_idx`` when the cumulative epsilon after it (worst case: every client
        selected, counted from the first round of the run, resumed or not) would exceed ``target_epsilon``.

        Raises:
            ValueError: naming the cumulative epsilon spent, the one the round would reach, and the fix.
        """
        if self.target_epsilon is None:
            return
        projected = self.epsilon_projected(spec)
        if projected > self.target_epsilon * (1 + 1e-6):
            raise ValueError(
                f"DualDP(target_epsilon={self.target_epsilon}): round {round_idx} would bring the cumulative epsilon "
                f"(worst case over clients) from {self.epsilon_spent():.4g} to {projected:.4g}; sigma was calibrated "
                f"for loop.num_rounds={spec.num_rounds}, and a run resumed with more rounds than it started with "
                "overspends: resume with the run's num_rounds, or start a new run with the rounds you want."
            )

    @override
    def epsilon_projected(self, spec: FederationSpec) -> float:
        self.calibrate(spec)
        return super().epsilon_projected(spec)


class DownlinkNoise(BroadcastTransform):
    r"""2DP-FL's server noise: :math:`w^k_{t+1} = \dot w^f_{t+1} + \mathcal N(0, (\sigma S)^2/U)` for each client k.

    Implements the download step of Alg. 1 of 2DP-FL (Xiong et al., IEEE TII 2021) with the paper's three
    modes: ``per_client`` (independent noise per client, 2DP-FL), ``shared`` (one draw for all clients in a
    round, "the common method") and ``none``. Noise is added to the model's parameters, not its buffers.
    Inferred: S is a server-side sensitivity constant and sigma defaults to the
    clients' DP-SGD multiplier: :class:`DualDPFL` (the bundle) hands its :class:`DualDP` over. With
    ``accumulate=True`` (the paper) the server averages the noisy local models, so the downlink noise stays in
    the global model (see :attr:`~lightning_fl.transforms.BroadcastTransform.persistent`); ``accumulate=False``
    measures each update against the model its client received and forgets the noise.

    Args:
        sensitivity: S.
        noise_multiplier: :math:`\sigma` (a number), or the :class:`DualDP` whose calibrated sigma is used.
        mode: ``per_client``, ``shared`` or ``none``.
        accumulate: keep the downlink noise in the aggregate (the paper's model averaging).

    Raises:
        ValueError: on a negative sensitivity or an unknown mode; at run time when no sigma can be found.
    """

    def __init__(
        self,
        *,
        sensitivity: float = 0.1,
        noise_multiplier: float | DualDP | None = None,
        mode: ServerNoiseMode = "per_client",
        accumulate: bool = True,
    ) -> None:
        check_non_negative(sensitivity, owner="DownlinkNoise", name="sensitivity")
        if mode not in ("per_client", "shared", "none"):
            raise ValueError(f"DownlinkNoise(mode={mode!r}) is unknown; use 'per_client', 'shared' or 'none'.")
        self.sensitivity, self.noise_multiplier, self.mode = sensitivity, noise_multiplier, mode
        self.persistent = accumulate
        self._params: set[str] = set()

    def setup(self, ctx: SetupContext) -> None:
        self._params = {name for name, _ in ctx.global_model.named_parameters()}
        if self.noise_multiplier is None:
            raise ValueError(
                "DownlinkNoise(noise_multiplier=None) has no sigma; give a number, or use the DualDPFL defence, "
                "which shares its clients' sigma with the downlink noise."
            )

    def _sigma(self, spec: FederationSpec) -> float:
        if isinstance(self.noise_multiplier, DualDP):
            return self.noise_multiplier.calibrate(spec)
        return float(self.noise_multiplier)

    @override
    def __call__(self, state: dict[str, Tensor], *, ctx: RoundContext) -> dict[str, Tensor]:
        if self.mode == "none":
            return state
        std = self._sigma(ctx.spec) * self.sensitivity / math.sqrt(ctx.spec.clients_per_round)
        parts = ("downlink", ctx.client_id) if self.mode == "per_client" else ("downlink",)
        generator = ctx.rng(*parts)
        return {
            k: v + gaussian_noise(v, std=std, generator=generator) if k in self._params and v.is_floating_point() else v
            for k, v in state.items()
        }


class DualDPFL(Defence):
    r"""2DP-FL (Xiong et al., IEEE TII 2021, Alg. 1) as one bundle: client DP-SGD and downlink noise, one sigma.

    Its parts are :class:`DualDP` (per-example DP-SGD in every client, sigma calibrated to ``target_epsilon``)
    and :class:`DownlinkNoise` on the model each client downloads, which reuses that sigma.

    Args:
        target_epsilon: the budget epsilon (paper: 20); ``None`` uses ``noise_multiplier`` as given.
        noise_multiplier: :math:`\sigma_k` when ``target_epsilon`` is ``None``.
        max_grad_norm: per-example clip bound G.
        delta: target delta (paper Fig. 6: 1e-3).
        accountant: ``rdp`` or ``prv``.
        sensitivity: the server-side sensitivity S of the downlink noise.
        mode: ``per_client``, ``shared`` or ``none`` (see :class:`DownlinkNoise`).
        accumulate: keep the downlink noise in the aggregate (the paper's model averaging).
        sampling: the clients' batches, ``poisson`` (default) or ``shuffled_batches`` (see :class:`DualDP`).
    """

    def __init__(
        self,
        *,
        target_epsilon: float | None = 20.0,
        noise_multiplier: float | None = None,
        max_grad_norm: float = 1.0,
        delta: float = 1e-3,
        accountant: AccountantName = "rdp",
        sensitivity: float = 0.1,
        mode: ServerNoiseMode = "per_client",
        accumulate: bool = True,
        sampling: Sampling = "poisson",
    ) -> None:
        if target_epsilon is not None:  # named here, as the user wrote it, before DualDP checks it again
            check_positive(target_epsilon, owner="DualDPFL", name="target_epsilon", hint="; it is the privacy budget")
        self.client = DualDP(
            target_epsilon=target_epsilon,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            delta=delta,
            accountant=accountant,
            sampling=sampling,
        )
        self.downlink = DownlinkNoise(
            sensitivity=sensitivity, noise_multiplier=self.client, mode=mode, accumulate=accumulate
        )

    @override
    def parts(self) -> DefenceParts:
        parts = self.client.parts()
        parts.broadcast_transforms.append(self.downlink)
        return parts
