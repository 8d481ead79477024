"""Per-example DP-SGD inside any Lightning Trainer (Opacus), and its federated shell Fed-CDP.

* :class:`PerExampleDP` is a plain Lightning callback: it wraps the module's parameters in Opacus'
  ``GradSampleModule`` hooks and the optimiser in Opacus' ``DPOptimizer`` for one ``fit`` and removes
  both afterwards, so it works with any ``LightningModule`` and with the one worker model that the
  :class:`~lightning_fl.federation.ClientRunner` reuses for every client.
* :class:`ClientDPSGD` runs it in every client of a federation: per-client accountants that persist in
  :attr:`ClientState.extra <lightning_fl.federation.ClientState.extra>` (and so resume), a per-round clip bound, epsilon
  after each round in ``summary.json["history"][i]["epsilon"]``, and the type-2 leak point fed with the
  gradient the client really applies (the noised one, which exists only inside the DP optimiser step).
* :class:`FedCDP` is the preset of Wei et al., "Gradient-Leakage Resilient Federated Learning"
  (ICDCS 2021), Alg. 2: per-example, per-layer clipping to C and Gaussian noise at every local step,
  with Fed-CDP(decay) as ``max_grad_norm=Schedule(6, end=2, kind="linear", num_rounds=100)``.

References:
    Wei et al., ICDCS 2021, arXiv:2107.01154. Abadi et al., "Deep Learning with Differential Privacy",
    CCS 2016. Opacus: Yousefpour et al., arXiv:2109.12298.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer, DPPerLayerOptimizer
from typing_extensions import override

from lightning_fl.callbacks.base import FederatedCallback
from lightning_fl.defences.base import Defence, DefenceParts
from lightning_fl.messages import ClientUpdate
from lightning_fl.privacy.accounting import AccountantName, Conversion, PrivacyAccountant, PrivacyLedger
from lightning_fl.privacy.schedules import Schedule

if TYPE_CHECKING:
    from lightning_fl.federation.contexts import FederationSpec
    from lightning_fl.federation.view import FederationView

__all__ = ["ClientDPSGD", "Clipping", "FedCDP", "NoiseScaling", "PerExampleDP"]

Clipping = Literal["per_layer", "flat"]
NoiseScaling = Literal["paper", "authors"]
AccountingNoise = Literal["nominal", "effective"]
AccountingScope = Literal["per_client", "federation"]
Release = Callable[[L.LightningModule, dict[str, torch.Tensor], Any, Any], None]

_OPACUS_PARAM_ATTRS = ("grad_sample", "summed_grad", "_forward_counter")
_OPACUS_MODULE_ATTRS = ("activations", "max_batch_len", "_forward_counter")


def opacus_noise_multiplier(
    *, noise_multiplier: float, clipping: Clipping, noise_scaling: NoiseScaling, num_tensors: int, batch_size: int
) -> float:
    r"""The multiplier to give Opacus so that its noise equals the noise a paper prescribes.

    Opacus adds one draw of std ``multiplier * total_clip_norm`` to the *sum* of clipped per-example gradients
    and divides by the batch size B. With per-layer clipping of M tensors to C each, the total clip norm is
    :math:`C\sqrt M`. Fed-CDP (Alg. 2, line 14) adds :math:`\mathcal N(0, \sigma^2C^2)` per layer to *each*
    example before averaging (``noise_scaling="paper"``: std :math:`\sigma C/\sqrt B` on the mean); the
    authors' code adds one draw per batch (``"authors"``: std :math:`\sigma C/B`, Abadi et al.'s DP-SGD).

    Example:
        >>> opacus_noise_multiplier(noise_multiplier=6.0, clipping="per_layer", noise_scaling="paper",
        ...                         num_tensors=4, batch_size=16)
        12.0
    """
    per_tensor = 1.0 / math.sqrt(num_tensors) if clipping == "per_layer" else 1.0
    per_example = math.sqrt(batch_size) if noise_scaling == "paper" else 1.0
    return noise_multiplier * per_tensor * per_example


class PerExampleDP(L.Callback):
    r"""Per-example gradient clipping and Gaussian noise at every optimiser step, via Opacus.

    Add it to any Trainer: ``L.Trainer(callbacks=[PerExampleDP(noise_multiplier=1.0, max_grad_norm=1.0)])``.
    At ``on_train_start`` it attaches Opacus' per-sample-gradient hooks to the module and replaces the
    (single) optimiser by a ``DPOptimizer``; at ``on_train_end`` it restores both, so the module is
    unchanged and can be trained again (by another client) with or without DP.

    Implements lines 8-15 of Alg. 2 (Fed-CDP) of Wei et al. (ICDCS 2021):
    :math:`\bar g_{j,m} = g_{j,m}/\max(1, \|g_{j,m}\|_2/C)`,
    :math:`\tilde g = \frac1B\sum_j(\bar g_j + \mathcal N(0,\sigma^2C^2 I))` with ``clipping="per_layer"`` and
    ``noise_scaling="paper"``; with ``clipping="flat"`` and ``noise_scaling="authors"`` it is the DP-SGD of
    Abadi et al. that 2DP-FL (Xiong et al., IEEE TII 2021, Alg. 1) runs on its clients.

    Inferred: batches are the loader's shuffled batches (as in the papers' code), while the accountant assumes
    Poisson sampling at rate B/n (spec B12-3). The released gradient (``release``) is the noised batch
    average that the optimiser applies; with B = 1 it is exactly the per-example sanitised gradient that
    Fed-CDP's type-2 attacker sees.

    Args:
        noise_multiplier: :math:`\sigma`, noise std relative to the clip bound (Fed-CDP default 6).
        max_grad_norm: clip bound C for each per-example gradient (each parameter tensor with
            ``clipping="per_layer"``, the whole gradient with ``"flat"``).
        clipping: ``per_layer`` (Fed-CDP) or ``flat`` (standard DP-SGD).
        noise_scaling: ``paper`` (noise on every example, std :math:`\sigma C/\sqrt B` on the mean) or
            ``authors`` (one draw per batch, :math:`\sigma C/B`).
        accountant: Opacus accountant recording each step (``rdp`` or ``prv``).
        conversion: RDP to (epsilon, delta) conversion (see :class:`PrivacyAccountant`).
        accounting_noise: the multiplier the accountant records: ``nominal`` is :math:`\sigma` as the papers
            account it; ``effective`` is the multiplier relative to the whole-gradient sensitivity that is
            really added (:func:`opacus_noise_multiplier`), sound for per-layer clipping.
        seed: seed of the noise generator (``None``: the global torch RNG).

    Raises:
        ValueError: on a non-positive clip bound, negative noise, or unknown option.
    """

    def __init__(
        self,
        *,
        noise_multiplier: float = 6.0,
        max_grad_norm: float = 4.0,
        clipping: Clipping = "per_layer",
        noise_scaling: NoiseScaling = "paper",
        accountant: AccountantName = "rdp",
        conversion: Conversion = "improved",
        accounting_noise: AccountingNoise = "nominal",
        seed: int | None = None,
    ) -> None:
        if noise_multiplier < 0:
            raise ValueError(f"PerExampleDP(noise_multiplier={noise_multiplier}) must be >= 0.")
        if max_grad_norm <= 0:
            raise ValueError(f"PerExampleDP(max_grad_norm={max_grad_norm}) must be > 0; it is the clip bound C.")
        if clipping not in ("per_layer", "flat"):
            raise ValueError(f"PerExampleDP(clipping={clipping!r}) is unknown; use 'per_layer' or 'flat'.")
        if noise_scaling not in ("paper", "authors"):
            raise ValueError(f"PerExampleDP(noise_scaling={noise_scaling!r}) is unknown; use 'paper' or 'authors'.")
        if accounting_noise not in ("nominal", "effective"):
            raise ValueError(
                f"PerExampleDP(accounting_noise={accounting_noise!r}) is unknown; use 'nominal' or 'effective'."
            )
        self.noise_multiplier, self.max_grad_norm = noise_multiplier, max_grad_norm
        self.clipping, self.noise_scaling, self.accounting_noise = clipping, noise_scaling, accounting_noise
        self.seed = seed
        self.privacy_accountant = PrivacyAccountant(accountant, conversion=conversion)
        self.release: Release | None = None
        self.sample_rate: float | None = None
        self._gsm: GradSampleModule | None = None
        self._batch: Any = None
        self._names: dict[torch.Tensor, str] = {}
        self._module: L.LightningModule | None = None

    # -- Lightning hooks ---------------------------------------------------------------------------------
    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._attach(trainer, pl_module)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch = batch

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        self._batch = None

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._detach(trainer, pl_module)

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._detach(trainer, pl_module)

    # -- attach / detach -----------------------------------------------------------------------------------
    def _attach(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"PerExampleDP supports exactly one optimizer, {type(pl_module).__name__}.configure_optimizers "
                f"returned {len(trainer.optimizers)}."
            )
        loader = trainer.train_dataloader
        batch_size = getattr(loader, "batch_size", None)
        if not batch_size:
            raise ValueError("PerExampleDP needs a train DataLoader with a fixed `batch_size` (the expected batch B).")
        optimizer = trainer.optimizers[0]
        params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        self._gsm = GradSampleModule(pl_module, loss_reduction="mean")
        multiplier = opacus_noise_multiplier(
            noise_multiplier=self.noise_multiplier,
            clipping=self.clipping,
            noise_scaling=self.noise_scaling,
            num_tensors=len(params),
            batch_size=batch_size,
        )
        options = {
            "noise_multiplier": multiplier,
            "expected_batch_size": batch_size,
            "generator": None if self.seed is None else torch.Generator().manual_seed(self.seed),
        }
        if self.clipping == "per_layer":
            dp_optimizer = DPPerLayerOptimizer(optimizer, max_grad_norm=[self.max_grad_norm] * len(params), **options)
        else:
            dp_optimizer = DPOptimizer(optimizer, max_grad_norm=self.max_grad_norm, **options)
        step_multiplier = multiplier if self.accounting_noise == "effective" else self.noise_multiplier
        sample_rate = self.sample_rate or batch_size / len(loader.dataset)
        dp_optimizer.attach_step_hook(lambda opt: self._on_dp_step(opt, step_multiplier, sample_rate))
        trainer.strategy.optimizers = [dp_optimizer]
        self._names = {p: n for n, p in pl_module.named_parameters()}
        self._module = pl_module

    def _detach(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._gsm is None:
            return
        self._gsm.remove_hooks()
        for p in pl_module.parameters():
            for attr in _OPACUS_PARAM_ATTRS:
                if hasattr(p, attr):
                    delattr(p, attr)
        for module in pl_module.modules():
            for attr in _OPACUS_MODULE_ATTRS:
                if attr in module.__dict__:
                    delattr(module, attr)
        dp_optimizer = trainer.strategy.optimizers[0]
        if isinstance(dp_optimizer, DPOptimizer):
            trainer.strategy.optimizers = [dp_optimizer.original_optimizer]
        self._gsm, self._names, self._module, self._batch = None, {}, None, None

    def _on_dp_step(self, optimizer: DPOptimizer, noise_multiplier: float, sample_rate: float) -> None:
        """Opacus step hook: the noised gradient is in ``p.grad`` now, right before the inner step."""
        self.privacy_accountant.step(noise_multiplier=noise_multiplier, sample_rate=sample_rate)
        if self.release is not None and self._module is not None:
            gradients = {self._names[p]: p.grad for p in optimizer.params if p.grad is not None}
            self.release(self._module, gradients, self._batch, optimizer)


class ClientDPSGD(Defence, FederatedCallback, PrivacyLedger):
    r"""Run :class:`PerExampleDP` in every client's Trainer, with per-client accounting across rounds.

    A defence bundle: put it in ``loop.defences``; its parts are the :class:`PerExampleDP` in every client's
    Trainer and itself as the federated callback that keeps the accounts. Each client
    keeps its own accountant in ``ClientState.extra`` (client-side state, checkpointed with the client, never
    with the server). After each client's fit, epsilon (the worst case over all clients so far) is logged
    as ``epsilon`` in the round's history and the clip bound as ``clip_bound``.

    Accounting (``accounting``): ``per_client`` records, per client, its local steps at sample rate
    :math:`q_k = B/n_k`, only in rounds where it trains (instance-level DP of each client's data; no
    amplification by client sampling is claimed). ``federation`` reproduces Fed-CDP's Sec. IV-B: one federation
    accountant with :math:`q = B\,K_t/N` (N: all training samples) and L local steps every round
    (Table VI's numbers then follow with ``steps_offset=1``, the authors' off-by-one, spec B7/B12-4).

    Args:
        noise_multiplier: :math:`\sigma`.
        max_grad_norm: clip bound C, a number or a :class:`~lightning_fl.privacy.Schedule` over rounds.
        clipping: ``per_layer`` or ``flat`` (see :class:`PerExampleDP`).
        noise_scaling: ``paper`` or ``authors`` (see :class:`PerExampleDP`).
        delta: target delta of the reported epsilon.
        accountant: ``rdp`` (default) or ``prv``.
        conversion: ``improved`` (Opacus) or ``classic`` (old TensorFlow Privacy, as Fed-CDP's Table VI).
        accounting_noise: ``nominal`` or ``effective`` (see :class:`PerExampleDP`).
        accounting: ``per_client`` or ``federation`` (above).
        steps_offset: extra steps counted once at the start with ``accounting="federation"`` (1 reproduces Table VI).

    Raises:
        ValueError: on an unknown option or a bad number (named in the message).
    """

    extra_key = "dp_sgd_accountant"

    def __init__(
        self,
        *,
        noise_multiplier: float = 6.0,
        max_grad_norm: float | Schedule = 4.0,
        clipping: Clipping = "per_layer",
        noise_scaling: NoiseScaling = "paper",
        delta: float = 1e-5,
        accountant: AccountantName = "rdp",
        conversion: Conversion = "improved",
        accounting_noise: AccountingNoise = "nominal",
        accounting: AccountingScope = "per_client",
        steps_offset: int = 0,
    ) -> None:
        if accounting not in ("per_client", "federation"):
            raise ValueError(
                f"{type(self).__name__}(accounting={accounting!r}) is unknown; use 'per_client' or 'federation'."
            )
        if not 0 < delta < 1:
            raise ValueError(f"{type(self).__name__}(delta={delta}) must be in (0, 1).")
        if steps_offset < 0:
            raise ValueError(f"{type(self).__name__}(steps_offset={steps_offset}) must be >= 0.")
        self.clip_schedule = max_grad_norm if isinstance(max_grad_norm, Schedule) else Schedule(float(max_grad_norm))
        self.dp = PerExampleDP(
            noise_multiplier=noise_multiplier,
            max_grad_norm=self.clip_schedule(0),
            clipping=clipping,
            noise_scaling=noise_scaling,
            accountant=accountant,
            conversion=conversion,
            accounting_noise=accounting_noise,
        )
        self.delta, self.accounting, self.steps_offset = delta, accounting, steps_offset
        self.accountant_name, self.conversion = accountant, conversion
        self.federation_accountant = self._new_accountant()
        self._epsilons: dict[int, float] = {}
        self._client_extra: dict[int, dict[str, Any]] = {}
        self._num_tensors = 0

    @property
    def noise_multiplier(self) -> float:
        return self.dp.noise_multiplier

    def _new_accountant(self) -> PrivacyAccountant:
        return PrivacyAccountant(self.accountant_name, conversion=self.conversion)

    @override
    def parts(self) -> DefenceParts:
        return DefenceParts(client_callbacks=[self.dp], callbacks=[self])

    # -- geometry of a round ----------------------------------------------------------------------------
    @staticmethod
    def _paper_sample_rate(spec: FederationSpec) -> float:
        return min(1.0, spec.batch_size * spec.clients_per_round / sum(spec.num_train_samples))

    @staticmethod
    def _paper_steps(spec: FederationSpec) -> int:
        return max(spec.steps_per_round(k) for k in range(spec.num_clients))

    def _step_multiplier(self, spec: FederationSpec, client_id: int) -> float:
        if self.dp.accounting_noise == "nominal":
            return self.dp.noise_multiplier
        return opacus_noise_multiplier(
            noise_multiplier=self.dp.noise_multiplier,
            clipping=self.dp.clipping,
            noise_scaling=self.dp.noise_scaling,
            num_tensors=self._num_tensors,
            batch_size=min(spec.batch_size, spec.num_train_samples[client_id]),
        )

    # -- federated hooks ---------------------------------------------------------------------------------
    @override
    def on_fit_start(self, loop: FederationView) -> None:
        if self.dp not in loop.client_callbacks:
            raise ValueError(
                f"{type(self).__name__} is a defence bundle: put it in loop.defences (YAML: the top-level "
                "`defences:` list), not in loop.callbacks, so that its PerExampleDP runs in every client's Trainer."
            )
        self._num_tensors = sum(1 for p in loop.global_model.parameters() if p.requires_grad)
        self._client_extra = {c.client_id: c.extra for c in loop.clients}
        spec = loop.spec
        if self.accounting == "federation" and not self.federation_accountant.history and self.steps_offset:
            self.federation_accountant.step(
                noise_multiplier=self._step_multiplier(spec, 0),
                sample_rate=self._paper_sample_rate(spec),
                steps=self.steps_offset,
            )
        self._epsilons = {
            c.client_id: self._client_accountant(c.extra).get_epsilon(self.delta)
            for c in loop.clients
            if self.extra_key in c.extra
        }

    @override
    def on_round_start(self, loop: FederationView, round_idx: int, selected: list[int]) -> None:
        if self.accounting == "federation":
            self.federation_accountant.step(
                noise_multiplier=self._step_multiplier(loop.spec, selected[0]),
                sample_rate=self._paper_sample_rate(loop.spec),
                steps=self._paper_steps(loop.spec),
            )

    @override
    def on_client_fit_start(self, loop: FederationView, client_id: int) -> None:
        client = loop.clients[client_id]
        self.dp.max_grad_norm = self.clip_schedule(loop.round_idx)
        self.dp.seed = loop.round_context().seed("per-example-dp", client_id)
        self.dp.sample_rate = loop.spec.sample_rate(client_id)
        self.dp.privacy_accountant = self._client_accountant(client.extra)

    @override
    def on_client_fit_end(self, loop: FederationView, update: ClientUpdate) -> None:
        accountant = self.dp.privacy_accountant
        loop.clients[update.client_id].extra[self.extra_key] = accountant.state_dict()
        self._epsilons[update.client_id] = accountant.get_epsilon(self.delta)
        self.dp.release = None
        loop.log_metrics({"epsilon": self.epsilon_spent(), "clip_bound": self.dp.max_grad_norm})

    def _client_accountant(self, extra: dict[str, Any]) -> PrivacyAccountant:
        accountant = self._new_accountant()
        if self.extra_key in extra:
            accountant.load_state_dict(extra[self.extra_key])
        return accountant

    # -- ledger ----------------------------------------------------------------------------------------------
    @override
    def epsilon_spent(self) -> float:
        if self.accounting == "federation":
            return self.federation_accountant.get_epsilon(self.delta)
        return max(self._epsilons.values(), default=0.0)

    @override
    def epsilon_projected(self, spec: FederationSpec) -> float:
        if self.accounting == "federation":
            return self.federation_accountant.epsilon_after(
                delta=self.delta,
                noise_multiplier=self._step_multiplier(spec, 0),
                sample_rate=self._paper_sample_rate(spec),
                steps=self._paper_steps(spec),
            )
        return max(
            self._client_accountant(self._client_extra.get(k, {})).epsilon_after(
                delta=self.delta,
                noise_multiplier=self._step_multiplier(spec, k),
                sample_rate=spec.sample_rate(k),
                steps=spec.steps_per_round(k),
            )
            for k in range(spec.num_clients)
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"federation_accountant": self.federation_accountant.state_dict()}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.federation_accountant.load_state_dict(state["federation_accountant"])


class FedCDP(ClientDPSGD):
    r"""Fed-CDP (Wei et al., ICDCS 2021, Alg. 2): per-example, per-layer clipping and noise in every client.

    The paper's defaults: :math:`\sigma = 6`, :math:`C = 4`, :math:`\delta = 10^{-5}`, noise on every example
    (``noise_scaling="paper"``; the authors' code draws once per batch: ``"authors"``). Fed-CDP(decay):
    ``max_grad_norm=Schedule(6.0, end=2.0, kind="linear", num_rounds=100)`` (Sec. VII-A); sigma is unchanged,
    so the accounting is too. Use the loop's ``FedAvg(weighted=False)`` for the paper's FedSGD average.

    Args:
        noise_multiplier: :math:`\sigma`.
        max_grad_norm: clip bound C or its schedule.
        noise_scaling: ``paper`` or ``authors``.
        delta: target delta.
        accountant: ``rdp`` or ``prv``.
        conversion: ``improved`` or ``classic``.
        accounting: ``per_client`` or ``federation`` (see :class:`ClientDPSGD`).
        steps_offset: Table VI's off-by-one with ``accounting="federation"``.
    """

    def __init__(
        self,
        *,
        noise_multiplier: float = 6.0,
        max_grad_norm: float | Schedule = 4.0,
        noise_scaling: NoiseScaling = "paper",
        delta: float = 1e-5,
        accountant: AccountantName = "rdp",
        conversion: Conversion = "improved",
        accounting: AccountingScope = "per_client",
        steps_offset: int = 0,
    ) -> None:
        super().__init__(
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            clipping="per_layer",
            noise_scaling=noise_scaling,
            delta=delta,
            accountant=accountant,
            conversion=conversion,
            accounting=accounting,
            steps_offset=steps_offset,
        )
