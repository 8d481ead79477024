"""Fed-SDP: client-level DP by per-layer clipping and Gaussian noise on each client's update.

Fed-SDP is the baseline of Wei et al., "Gradient-Leakage Resilient Federated Learning" (ICDCS 2021), Alg. 1,
i.e. the client-level DP-FL of McMahan et al. (ICLR 2018) and Geyer et al. (2017): local training is not
private; the update each client sends is clipped per layer to C and noised once per round. It resists the
type-0/1 leakage (the aggregate, the shared update) but not type-2 (local gradients stay raw): Table VII.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from torch import Tensor
from typing_extensions import override

from lightning_fl.defences.base import Defence, DefenceParts
from lightning_fl.messages import ClientUpdate
from lightning_fl.privacy.accounting import AccountantName, Conversion, PrivacyAccountant, PrivacyLedger
from lightning_fl.privacy.clipping import clip_per_tensor
from lightning_fl.privacy.mechanisms import gaussian_noise
from lightning_fl.transforms import ClientTransform, ServerTransform
from lightning_fl.validation import check_non_negative, check_positive

if TYPE_CHECKING:
    from lightning_fl.contexts import ClientContext, FederationSpec, RoundContext

__all__ = ["FedSDP", "FedSDPServerNoise"]


class _ClientLevelLedger(PrivacyLedger):
    r"""Fed-SDP's options and client-level accounting (Sec. IV-B): one Gaussian step per round at :math:`q_2 = K_t/K`.

    Args:
        noise_multiplier: :math:`\sigma`.
        max_grad_norm: per-layer clip bound C (the sensitivity).
        delta: target delta of the reported epsilon.
        accountant: ``rdp`` or ``prv``.
        conversion: ``improved`` or ``classic``.
        steps_offset: extra steps counted once (1 reproduces Table VI).
    """

    def __init__(
        self,
        *,
        noise_multiplier: float = 6.0,
        max_grad_norm: float = 4.0,
        delta: float = 1e-5,
        accountant: AccountantName = "rdp",
        conversion: Conversion = "improved",
        steps_offset: int = 0,
    ) -> None:
        owner = type(self).__name__
        check_positive(max_grad_norm, owner=owner, name="max_grad_norm", hint="; it is the clip bound C")
        check_non_negative(noise_multiplier, owner=owner, name="noise_multiplier")
        if not 0 < delta < 1:
            raise ValueError(f"{type(self).__name__}(delta={delta}) must be in (0, 1).")
        self.max_grad_norm, self.noise_multiplier, self.delta = max_grad_norm, noise_multiplier, delta
        self.steps_offset = steps_offset
        self.privacy_accountant = PrivacyAccountant(accountant, conversion=conversion)
        self._accounted_round = -1

    def _account_round(self, ctx: RoundContext) -> None:
        if self.noise_multiplier == 0 or self._accounted_round == ctx.round_idx:
            return
        steps = 1 + (self.steps_offset if not self.privacy_accountant.history else 0)
        self.privacy_accountant.step(
            noise_multiplier=self.noise_multiplier,
            sample_rate=ctx.spec.clients_per_round / ctx.spec.num_clients,
            steps=steps,
        )
        self._accounted_round = ctx.round_idx
        ctx.log_metrics({"epsilon": self.epsilon_spent()})

    def epsilon_spent(self) -> float:
        return self.privacy_accountant.get_epsilon(self.delta) if self.noise_multiplier else 0.0

    def epsilon_projected(self, spec: FederationSpec) -> float:
        if self.noise_multiplier == 0:
            return 0.0
        return self.privacy_accountant.epsilon_after(
            delta=self.delta,
            noise_multiplier=self.noise_multiplier,
            sample_rate=spec.clients_per_round / spec.num_clients,
            steps=1 + (self.steps_offset if not self.privacy_accountant.history else 0),
        )

    def state_dict(self) -> dict[str, Any]:
        return {"accountant": self.privacy_accountant.state_dict(), "accounted_round": self._accounted_round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.privacy_accountant.load_state_dict(state["accountant"])
        self._accounted_round = int(state["accounted_round"])


class FedSDP(_ClientLevelLedger, ClientTransform, Defence):
    r"""Clip each client's update per layer and add Gaussian noise at the client, before it is sent.

    Implements lines 8-12 of Alg. 1 (Fed-SDP) of Wei et al. (ICDCS 2021), typos corrected:
    :math:`\Delta\bar W_{k,m} = \Delta W_{k,m}/\max(1, \|\Delta W_{k,m}\|_2/C)`, then
    :math:`\Delta\bar W_{k,m} + \mathcal N(0, \sigma^2C^2 I)` for every layer m (parameter tensor). Inferred:
    noise at the client, which is what makes the shared update itself private (Table VII type 1).
    The server variant of the paper ("only resilient to type-0 leakage") is ``FedSDP(noise_multiplier=0)``
    (clip only) with :class:`FedSDPServerNoise` as a server transform. Epsilon is client-level, one step per
    round at :math:`q_2 = K_t/K` (Table VI uses T + 1 steps: ``steps_offset=1``), logged as ``epsilon``.
    Use ``FedAvg(weighted=False)`` for the paper's plain average (FedSGD).

    Args:
        noise_multiplier: :math:`\sigma` (paper default 6); 0 clips only.
        max_grad_norm: per-layer clip bound C (paper default 4).
        delta: target delta of the reported epsilon.
        accountant: ``rdp`` or ``prv``.
        conversion: ``improved`` or ``classic`` (Table VI).
        steps_offset: extra steps counted once (1 reproduces Table VI).

    Raises:
        ValueError: on a non-positive clip bound, negative noise or a delta outside (0, 1).

    Example:
        >>> import torch
        >>> sdp = FedSDP(noise_multiplier=0.0, max_grad_norm=1.0)
        >>> update = ClientUpdate(0, 0, {"w": torch.tensor([3.0, 4.0])}, num_samples=10, loss=0.1)
        >>> sdp(update, ctx=None).delta
        {'w': tensor([0.6000, 0.8000])}
    """

    @override
    def parts(self) -> DefenceParts:
        return DefenceParts(client_transforms=[self])

    @override
    def __call__(self, update: ClientUpdate, *, ctx: ClientContext) -> ClientUpdate:
        clipped = clip_per_tensor(update.delta, max_norm=self.max_grad_norm)
        if self.noise_multiplier > 0:
            generator = ctx.rng("fed-sdp", update.client_id)
            std = self.noise_multiplier * self.max_grad_norm
            clipped = {k: v + gaussian_noise(v, std=std, generator=generator) for k, v in clipped.items()}
            self._account_round(ctx)
        return replace(update, delta=clipped, metadata={**update.metadata, "clip_bound": self.max_grad_norm})


class FedSDPServerNoise(_ClientLevelLedger, ServerTransform, Defence):
    r"""Fed-SDP's server-side variant: one Gaussian draw on the average of clipped updates.

    :math:`\Delta\tilde W = \frac{1}{K_t}\big(\sum_k \Delta\bar W_k + \mathcal N(0, \sigma^2C^2 I)\big)`
    (the authors' code). Pair it with ``FedSDP(noise_multiplier=0, max_grad_norm=C)`` on the
    clients; the shared updates are then clipped but not noised (type-1 leakage unprotected).

    Args:
        noise_multiplier: :math:`\sigma`.
        max_grad_norm: the clients' per-layer clip bound C (the sensitivity).
        delta: target delta of the reported epsilon.
        accountant: ``rdp`` or ``prv``.
        conversion: ``improved`` or ``classic``.
        steps_offset: extra steps counted once (1 reproduces Table VI).

    Raises:
        ValueError: on a non-positive clip bound, negative noise or a delta outside (0, 1).
    """

    @override
    def parts(self) -> DefenceParts:
        return DefenceParts(server_transforms=[self])

    @override
    def __call__(self, delta: dict[str, Tensor], *, ctx: RoundContext) -> dict[str, Tensor]:
        generator = ctx.rng("fed-sdp-server")
        std = self.noise_multiplier * self.max_grad_norm / ctx.spec.clients_per_round
        self._account_round(ctx)
        return {k: v + gaussian_noise(v, std=std, generator=generator) for k, v in delta.items()}
