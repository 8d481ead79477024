"""Per-example DP-SGD in every client of a federation (Fed-CDP); the callback itself is in :mod:`.dp_sgd`.

* :class:`PerExampleDP` is a plain Lightning callback: it wraps the module's parameters in Opacus'
  ``GradSampleModule`` hooks and the optimiser in Opacus' ``DPOptimizer`` for one ``fit`` and removes
  both afterwards, so it works with any ``LightningModule`` and with the one worker model that the
  :class:`~lightning_fl.federation.ClientRunner` reuses for every client. It logs epsilon through the module's
  logger and keeps its accountant in Lightning checkpoints. Layers that compute their own weights from
  private, batch-free inputs (passports, key-locks: ``per_example_unit = True``) get their per-example
  gradients from ``torch.func`` as one unit, so DP-SGD composes with FDL-PP and FedKL.
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

from typing import TYPE_CHECKING, Any, Literal

from torch import nn
from typing_extensions import override

from lightning_fl.callbacks.base import FederatedCallback
from lightning_fl.defences.base import Defence, DefenceParts
from lightning_fl.defences.dp.dp_sgd import AccountingNoise, PerExampleDP, Sampling, check_dp_sgd_options
from lightning_fl.defences.dp.opacus_hooks import (
    Clipping,
    NoiseScaling,
    check_per_example_model,
    opacus_noise_multiplier,
)
from lightning_fl.messages import ClientUpdate
from lightning_fl.privacy.accounting import AccountantName, Conversion, PrivacyAccountant, PrivacyLedger
from lightning_fl.privacy.schedules import Schedule

if TYPE_CHECKING:
    from lightning_fl.contexts import FederationSpec
    from lightning_fl.view import FederationView

__all__ = ["AccountingScope", "ClientDPSGD", "Clipping", "FedCDP", "NoiseScaling", "PerExampleDP", "Sampling"]

AccountingScope = Literal["per_client", "federation"]


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
    (Table VI's numbers then follow with ``steps_offset=1``, the authors' off-by-one).

    Args:
        noise_multiplier: :math:`\sigma`.
        max_grad_norm: clip bound C, a number or a :class:`~lightning_fl.privacy.Schedule` over rounds.
        clipping: ``per_layer`` or ``flat`` (see :class:`PerExampleDP`).
        noise_scaling: ``per_batch`` or ``per_example`` (see :data:`NoiseScaling`).
        delta: target delta of the reported epsilon.
        accountant: ``rdp`` (default) or ``prv``.
        conversion: ``improved`` (Opacus) or ``classic`` (old TensorFlow Privacy, as Fed-CDP's Table VI).
        accounting_noise: ``nominal`` or ``effective`` (see :class:`PerExampleDP`).
        accounting: ``per_client`` or ``federation`` (above).
        steps_offset: extra steps counted once at the start with ``accounting="federation"`` (1 reproduces Table VI).
        sampling: ``poisson`` (default, what the accountant assumes) or ``shuffled_batches`` (see
            :class:`PerExampleDP`); ``summary.json["privacy"]`` states which one the run used.

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
        noise_scaling: NoiseScaling = "per_batch",
        delta: float = 1e-5,
        accountant: AccountantName = "rdp",
        conversion: Conversion = "improved",
        accounting_noise: AccountingNoise = "nominal",
        accounting: AccountingScope = "per_client",
        steps_offset: int = 0,
        sampling: Sampling = "poisson",
    ) -> None:
        if accounting not in ("per_client", "federation"):
            raise ValueError(
                f"{type(self).__name__}(accounting={accounting!r}) is unknown; use 'per_client' or 'federation'."
            )
        if steps_offset < 0:
            raise ValueError(f"{type(self).__name__}(steps_offset={steps_offset}) must be >= 0.")
        self.clip_schedule = max_grad_norm if isinstance(max_grad_norm, Schedule) else Schedule(float(max_grad_norm))
        dp_sgd = {
            "noise_multiplier": noise_multiplier,
            "max_grad_norm": self.clip_schedule(0),
            "clipping": clipping,
            "noise_scaling": noise_scaling,
            "delta": delta,
            "accounting_noise": accounting_noise,
            "sampling": sampling,
        }
        check_dp_sgd_options(type(self).__name__, **dp_sgd)  # named after this class, not PerExampleDP
        # seeded again for every client and round in on_client_fit_start; never the global generator
        self.dp = PerExampleDP(**dp_sgd, accountant=accountant, conversion=conversion, seed=0)
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

    @override
    def check_model(self, model: nn.Module) -> None:
        """Opacus' layer rules (:func:`check_per_example_model`), checked when the loop is built."""
        check_per_example_model(model, owner=type(self).__name__)

    # -- geometry of a round ----------------------------------------------------------------------------
    @staticmethod
    def _federation_sample_rate(spec: FederationSpec) -> float:
        return min(1.0, spec.batch_size * spec.clients_per_round / sum(spec.num_train_samples))

    @staticmethod
    def _federation_steps(spec: FederationSpec) -> int:
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
    def on_fit_start(self, federation: FederationView) -> None:
        if self.dp not in federation.client_callbacks:
            raise ValueError(
                f"{type(self).__name__} is a defence bundle: put it in loop.defences (YAML: the top-level "
                "`defences:` list), not in loop.callbacks, so that its PerExampleDP runs in every client's Trainer."
            )
        self._num_tensors = sum(1 for p in federation.global_model.parameters() if p.requires_grad)
        self._client_extra = {c.client_id: c.extra for c in federation.clients}
        spec = federation.spec
        if self.accounting == "federation" and not self.federation_accountant.history and self.steps_offset:
            self.federation_accountant.step(
                noise_multiplier=self._step_multiplier(spec, 0),
                sample_rate=self._federation_sample_rate(spec),
                steps=self.steps_offset,
            )
        self._epsilons = {
            c.client_id: self._client_accountant(c.extra).get_epsilon(self.delta)
            for c in federation.clients
            if self.extra_key in c.extra
        }
        federation.describe_privacy(type(self).__name__, self._sampling_facts())

    def _sampling_facts(self) -> dict[str, Any]:
        rate = "B*K_t/N per round (Fed-CDP Sec. IV-B)" if self.accounting == "federation" else "B/n_k per local step"
        facts = {"sampling": self.dp.sampling, "accountant": self.accountant_name, "accountant_sample_rate": rate}
        if self.dp.sampling == "shuffled_batches":
            facts["note"] = (
                "epsilon assumes Poisson sampling; the clients trained on shuffled fixed-size batches, so it is "
                "not a proven bound for this run"
            )
        return facts

    @override
    def on_round_start(self, federation: FederationView, round_idx: int, selected: list[int]) -> None:
        if self.accounting == "federation":
            self.federation_accountant.step(
                noise_multiplier=self._step_multiplier(federation.spec, selected[0]),
                sample_rate=self._federation_sample_rate(federation.spec),
                steps=self._federation_steps(federation.spec),
            )

    @override
    def on_client_fit_start(self, federation: FederationView, client_id: int) -> None:
        client = federation.clients[client_id]
        self.dp.max_grad_norm = self.clip_schedule(federation.round_idx)
        self.dp.seed = federation.round_context().seed("per-example-dp", client_id)
        self.dp.sample_rate = federation.spec.sample_rate(client_id)
        self.dp.privacy_accountant = self._client_accountant(client.extra)

    @override
    def on_client_fit_end(self, federation: FederationView, update: ClientUpdate) -> None:
        accountant = self.dp.privacy_accountant
        federation.set_client_extra(update.client_id, self.extra_key, accountant.state_dict())
        self._client_extra[update.client_id] = {self.extra_key: accountant.state_dict()}
        self._epsilons[update.client_id] = accountant.get_epsilon(self.delta)
        self.dp.release = None
        federation.log_metrics({"epsilon": self.epsilon_spent(), "clip_bound": self.dp.max_grad_norm})

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
                sample_rate=self._federation_sample_rate(spec),
                steps=self._federation_steps(spec),
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
    (``noise_scaling="per_example"``, Alg. 2 line 14; the authors' code draws once per batch: ``"per_batch"``).
    Fed-CDP(decay):
    ``max_grad_norm=Schedule(6.0, end=2.0, kind="linear", num_rounds=100)`` (Sec. VII-A); sigma is unchanged,
    so the accounting is too. Use the loop's ``FedAvg(weighted=False)`` for the paper's FedSGD average.

    Args:
        noise_multiplier: :math:`\sigma`.
        max_grad_norm: clip bound C or its schedule.
        noise_scaling: ``per_example`` (Alg. 2) or ``per_batch`` (the authors' code).
        delta: target delta.
        accountant: ``rdp`` or ``prv``.
        conversion: ``improved`` or ``classic``.
        accounting: ``per_client`` or ``federation`` (see :class:`ClientDPSGD`).
        steps_offset: Table VI's off-by-one with ``accounting="federation"``.
        sampling: ``poisson`` or ``shuffled_batches`` (the authors' code; see :class:`PerExampleDP`).
    """

    def __init__(
        self,
        *,
        noise_multiplier: float = 6.0,
        max_grad_norm: float | Schedule = 4.0,
        noise_scaling: NoiseScaling = "per_example",
        delta: float = 1e-5,
        accountant: AccountantName = "rdp",
        conversion: Conversion = "improved",
        accounting: AccountingScope = "per_client",
        steps_offset: int = 0,
        sampling: Sampling = "poisson",
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
            sampling=sampling,
        )
