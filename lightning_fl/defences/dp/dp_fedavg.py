r"""DP-FedAvg with adaptive clipping: user-level DP as production FL deploys it.

DP-FedAvg (McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR 2018, Alg. 1) clips
each sampled client's update to the bound :math:`C`, averages with a fixed denominator and adds Gaussian noise
at the server. Adaptive clipping (Andrew et al., "Differentially Private Learning with Adaptive Clipping",
NeurIPS 2021, Alg. 1) moves :math:`C` each round toward the :math:`\gamma`-quantile of the update norms with a
geometric step driven by a noised count of unclipped updates. With :math:`m` = clients per round:

.. math::

    \bar\Delta = \frac1m\Big(\sum_i \Delta_i\min\big(1, \tfrac{C}{\|\Delta_i\|}\big)
    + \mathcal N(0, z_\Delta^2C^2I)\Big),
    \quad \tilde b = \frac1m\Big(\sum_i \mathbb 1[\|\Delta_i\| \le C] + \mathcal N(0, \sigma_b^2)\Big),
    \quad C \leftarrow C\,e^{-\eta_C(\tilde b - \gamma)}

and the two Gaussian mechanisms compose to one of noise multiplier :math:`z` with
:math:`z_\Delta = (z^{-2} - (2\sigma_b)^{-2})^{-1/2}` (Andrew et al., Sec. 3.1). The accountant records one step
per round at the client sampling rate :math:`q = m/N` (McMahan et al., Sec. 3).

References:
    McMahan et al., ICLR 2018, arXiv:1710.06963. Andrew et al., NeurIPS 2021, arXiv:1905.03871.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from typing_extensions import override

from lightning_fl.callbacks.base import FederatedCallback
from lightning_fl.defences.base import Defence, DefenceParts
from lightning_fl.messages import ClientUpdate
from lightning_fl.privacy.accounting import AccountantName, PrivacyAccountant, PrivacyLedger
from lightning_fl.privacy.clipping import state_norm
from lightning_fl.privacy.mechanisms import gaussian_noise
from lightning_fl.server.aggregation import Aggregator, weighted_sum
from lightning_fl.server.fedopt import ServerOptimizer
from lightning_fl.transforms import ClientTransform
from lightning_fl.validation import check_non_negative, check_positive

if TYPE_CHECKING:
    from lightning_fl.contexts import ClientContext, FederationSpec, RoundContext
    from lightning_fl.view import FederationView

__all__ = ["DPFedAvg", "update_noise_multiplier"]

_UNCLIPPED = "dp_fedavg_unclipped"


def update_noise_multiplier(*, noise_multiplier: float, clipped_count_stddev: float) -> float:
    r"""The update's share :math:`z_\Delta = (z^{-2} - (2\sigma_b)^{-2})^{-1/2}` of the total multiplier :math:`z`.

    Andrew et al. (NeurIPS 2021), Sec. 3.1: the clipped count (sensitivity 1/2 around its centre) and the update
    (sensitivity C) are released together with the privacy of one Gaussian mechanism of multiplier z.

    Raises:
        ValueError: when :math:`2\sigma_b \le z`: the count's noise alone would exceed the budget; the message names
            :math:`\sigma_b = z` (the update's multiplier is then :math:`2z/\sqrt 3`) and the largest z that works.

    Example:
        >>> round(update_noise_multiplier(noise_multiplier=1.0, clipped_count_stddev=5.0), 4)
        1.005
    """
    if noise_multiplier <= 0:
        raise ValueError(f"DPFedAvg(noise_multiplier={noise_multiplier}) must be > 0.")
    if 2 * clipped_count_stddev <= noise_multiplier:
        works = update_noise_multiplier(noise_multiplier=noise_multiplier, clipped_count_stddev=noise_multiplier)
        raise ValueError(
            f"DPFedAvg(clipped_count_stddev={clipped_count_stddev:g}) must exceed noise_multiplier/2 = "
            f"{noise_multiplier / 2:g} (its default is clients_per_round/20); "
            f"set clipped_count_stddev={noise_multiplier:g} "
            f"(the update's noise multiplier is then {works:.3g}), or noise_multiplier below "
            f"{2 * clipped_count_stddev:g}; Andrew et al. use clients_per_round/20 with z <= 1."
        )
    return (noise_multiplier**-2 - (2 * clipped_count_stddev) ** -2) ** -0.5


class DPFedAvg(Defence, ClientTransform, FederatedCallback, PrivacyLedger):
    r"""DP-FedAvg (McMahan et al., ICLR 2018) with adaptive clipping (Andrew et al., NeurIPS 2021): a defence bundle.

    Parts: a client transform that clips the update to the round's bound :math:`C` (flat L2, the whole update) and
    reports whether it was clipped; the aggregator that sums the clipped updates, adds the server's Gaussian noise
    and divides by the clients per round :math:`m` (a fixed denominator, so one client changes the average by at
    most :math:`C/m`), then moves :math:`C`; and itself as the callback that states the accounting in
    ``summary.json["privacy"]``. ``epsilon`` (at ``delta``) and ``clip_bound`` are logged every round (history,
    CSV, W&B). ``clip_learning_rate=0`` is DP-FedAvg with the fixed bound ``initial_clip`` (then the whole
    multiplier goes to the update).

    Inferred: the aggregate weights clients uniformly (Andrew et al.; McMahan et al. weight by capped sample
    counts); the selector draws exactly :math:`m` of :math:`N` clients while the accountant assumes Poisson
    sampling at :math:`q = m/N`, as McMahan et al. and Flower account it; the summary says so.

    Args:
        noise_multiplier: :math:`z`, the total noise multiplier of a round (update and clipped count together).
        initial_clip: :math:`C_0` (Andrew et al.: 0.1).
        target_quantile: :math:`\gamma`, the share of updates left unclipped (0.5).
        clip_learning_rate: :math:`\eta_C` of the geometric update (0.2); 0 keeps the clip fixed.
        clipped_count_stddev: :math:`\sigma_b`, noise std of the unclipped count; ``None`` takes :math:`m/20`.
        delta: target delta of the reported epsilon.
        accountant: ``rdp`` (default) or ``prv``.
        server_optimizer: a server optimiser (:class:`~lightning_fl.server.FedAvgM`, ...) applied to the noised
            average, as Andrew et al. run server momentum; ``None`` adds the average itself.

    Raises:
        ValueError: on a non-positive clip, noise or learning rate outside its range, a quantile outside (0, 1),
            or a count noise too small for ``noise_multiplier`` (at setup, when :math:`m` is known).
    """

    def __init__(
        self,
        *,
        noise_multiplier: float = 1.0,
        initial_clip: float = 0.1,
        target_quantile: float = 0.5,
        clip_learning_rate: float = 0.2,
        clipped_count_stddev: float | None = None,
        delta: float = 1e-5,
        accountant: AccountantName = "rdp",
        server_optimizer: ServerOptimizer | None = None,
    ) -> None:
        check_positive(noise_multiplier, owner="DPFedAvg", name="noise_multiplier", hint=" (z of Andrew et al.)")
        check_positive(initial_clip, owner="DPFedAvg", name="initial_clip", hint="; Andrew et al. start at 0.1")
        if not 0 < target_quantile < 1:
            raise ValueError(f"DPFedAvg(target_quantile={target_quantile}) must be in (0, 1); 0.5 is the median.")
        check_non_negative(clip_learning_rate, owner="DPFedAvg", name="clip_learning_rate", hint=" (0: fixed clip)")
        if not 0 < delta < 1:
            raise ValueError(f"DPFedAvg(delta={delta}) must be in (0, 1).")
        self.noise_multiplier, self.initial_clip, self.target_quantile = noise_multiplier, initial_clip, target_quantile
        self.clip_learning_rate, self.clipped_count_stddev, self.delta = clip_learning_rate, clipped_count_stddev, delta
        self.server_optimizer = server_optimizer
        self.privacy_accountant = PrivacyAccountant(accountant)
        self.clip = initial_clip
        self._aggregator = _DPFedAvgAggregator(self)

    @override
    def parts(self) -> DefenceParts:
        return DefenceParts(client_transforms=[self], callbacks=[self], aggregator=self._aggregator)

    # -- noise split -----------------------------------------------------------------------------------------
    def noise_split(self, clients_per_round: int) -> tuple[float, float]:
        """``(z_update, sigma_count)``: the update's noise multiplier and the clipped count's noise std."""
        if self.clip_learning_rate == 0:
            return self.noise_multiplier, 0.0
        sigma_b = self.clipped_count_stddev if self.clipped_count_stddev is not None else clients_per_round / 20
        return update_noise_multiplier(noise_multiplier=self.noise_multiplier, clipped_count_stddev=sigma_b), sigma_b

    @override
    def setup(self, ctx: Any) -> None:
        self.noise_split(ctx.spec.clients_per_round)  # fails before training on an impossible split

    # -- client side: clip to the broadcast bound --------------------------------------------------------------
    @override
    def __call__(self, update: ClientUpdate, *, ctx: ClientContext) -> ClientUpdate:
        norm = float(state_norm(update.delta))
        scale = min(1.0, self.clip / norm) if norm > 0 else 1.0
        clipped = {k: v * scale for k, v in update.delta.items()}
        return dataclasses.replace(update, delta=clipped, metadata={**update.metadata, _UNCLIPPED: norm <= self.clip})

    # -- server side -------------------------------------------------------------------------------------------
    def server_step(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> tuple[dict[str, Tensor], dict]:
        """Noised average of the clipped updates, the server optimiser's step on it, the next clip, the accounts."""
        m = ctx.spec.clients_per_round
        z_update, sigma_b = self.noise_split(m)
        generator = ctx.rng("dp-fedavg")
        total = weighted_sum([u.delta for u in updates], [1.0] * len(updates))
        average = {
            k: (v + gaussian_noise(v, std=z_update * self.clip, generator=generator)) / m for k, v in total.items()
        }
        if self.server_optimizer is not None:
            average = {k: self.server_optimizer.step(k, v.double()).to(v.dtype) for k, v in average.items()}
        unclipped = sum(bool(u.metadata.get(_UNCLIPPED)) for u in updates)
        metrics = {"clip_bound": self.clip, "unclipped_fraction": unclipped / len(updates)}
        if self.clip_learning_rate > 0:
            noisy = (unclipped + sigma_b * float(torch.randn((), generator=generator))) / m
            self.clip *= math.exp(-self.clip_learning_rate * (noisy - self.target_quantile))
        self.privacy_accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=m / ctx.spec.num_clients)
        return average, {**metrics, "epsilon": self.epsilon_spent()}

    # -- callback: what the summary says about the accounting -------------------------------------------------
    @override
    def on_fit_start(self, federation: FederationView) -> None:
        spec = federation.spec
        z_update, sigma_b = self.noise_split(spec.clients_per_round)
        federation.describe_privacy(
            type(self).__name__,
            {
                "level": "user (one client's whole update)",
                "client_sampling": f"uniform {spec.clients_per_round} of {spec.num_clients} per round",
                "accountant_sample_rate": spec.clients_per_round / spec.num_clients,
                "note": "epsilon assumes Poisson client sampling at that rate (McMahan et al., Flower)",
                "noise_multiplier": self.noise_multiplier,
                "update_noise_multiplier": z_update,
                "clipped_count_stddev": sigma_b,
            },
        )

    # -- ledger and state --------------------------------------------------------------------------------------
    @override
    def epsilon_spent(self) -> float:
        return self.privacy_accountant.get_epsilon(self.delta)

    @override
    def epsilon_projected(self, spec: FederationSpec) -> float:
        return self.privacy_accountant.epsilon_after(
            delta=self.delta,
            noise_multiplier=self.noise_multiplier,
            sample_rate=spec.clients_per_round / spec.num_clients,
            steps=1,
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        optimizer = self.server_optimizer.state_dict() if self.server_optimizer is not None else {}
        return {"accountant": self.privacy_accountant.state_dict(), "clip": self.clip, "server_optimizer": optimizer}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.privacy_accountant.load_state_dict(state["accountant"])
        self.clip = float(state["clip"])
        if self.server_optimizer is not None:
            self.server_optimizer.load_state_dict(state["server_optimizer"])


class _DPFedAvgAggregator(Aggregator):
    """The server half of :class:`DPFedAvg`: delegates to its :meth:`~DPFedAvg.server_step`."""

    def __init__(self, bundle: DPFedAvg) -> None:
        self.bundle = bundle

    @override
    def aggregate(
        self, updates: Sequence[ClientUpdate], *, ctx: RoundContext
    ) -> tuple[dict[str, Tensor], dict[str, float]]:
        return self.bundle.server_step(updates, ctx)
