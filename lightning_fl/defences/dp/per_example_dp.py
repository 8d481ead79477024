"""Per-example DP-SGD inside any Lightning Trainer (Opacus), and its federated shell Fed-CDP.

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

import copy
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer, DPPerLayerOptimizer
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from lightning_fl.callbacks.base import FederatedCallback
from lightning_fl.defences.base import Defence, DefenceParts
from lightning_fl.messages import ClientUpdate
from lightning_fl.privacy.accounting import AccountantName, Conversion, PrivacyAccountant, PrivacyLedger
from lightning_fl.privacy.schedules import Schedule
from lightning_fl.validation import check_non_negative, check_positive

if TYPE_CHECKING:
    from lightning_fl.federation.contexts import FederationSpec
    from lightning_fl.federation.view import FederationView

__all__ = ["ClientDPSGD", "Clipping", "FedCDP", "NoiseScaling", "PerExampleDP"]

Clipping = Literal["per_layer", "flat"]
NoiseScaling = Literal["per_batch", "per_example"]
r"""How many Gaussian draws of std :math:`\sigma C` go into a batch's summed clipped gradient: ``per_batch`` one
(DP-SGD of Abadi et al.; Opacus; 2DP-FL; Fed-CDP's released code), ``per_example`` one per example (Fed-CDP Alg. 2
line 14 as printed: std :math:`\sigma C\sqrt B` on the sum)."""
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
    example before averaging (``noise_scaling="per_example"``: std :math:`\sigma C/\sqrt B` on the mean); the
    authors' code and Abadi et al.'s DP-SGD add one draw per batch (``"per_batch"``: std :math:`\sigma C/B`).

    Example:
        >>> opacus_noise_multiplier(noise_multiplier=6.0, clipping="per_layer", noise_scaling="per_example",
        ...                         num_tensors=4, batch_size=16)
        12.0
        >>> opacus_noise_multiplier(noise_multiplier=1.0, clipping="flat", noise_scaling="per_batch",
        ...                         num_tensors=4, batch_size=16)
        1.0
    """
    per_tensor = 1.0 / math.sqrt(num_tensors) if clipping == "per_layer" else 1.0
    per_example = math.sqrt(batch_size) if noise_scaling == "per_example" else 1.0
    return noise_multiplier * per_tensor * per_example


class _UnitGradSampler:
    """Per-example gradients of one layer that Opacus' layer-wise hooks cannot split (a passport or key-lock layer).

    Such a layer builds its weights from private inputs without a batch dimension (passports, a key) through
    sub-layers that Opacus would hook one by one. Here the whole layer is one function of the example:
    the backward hook replays it on each example with ``torch.func`` (``vmap`` of ``grad`` of
    :math:`\\langle f_\\theta(x_j), \\partial L/\\partial f(x_j)\\rangle`) and stores ``grad_sample`` as Opacus does.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.replica = copy.deepcopy(module).to("meta")  # structure only; weights come from functional_call
        self.inputs: list[Tensor] = []
        self.handles: list[RemovableHandle] = [
            module.register_forward_hook(self._capture),
            module.register_full_backward_hook(self._per_example_gradients),
        ]

    def _capture(self, module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        if module.training and torch.is_grad_enabled():
            self.inputs.append(inputs[0].detach())

    def _per_example_gradients(self, module: nn.Module, grad_input: Any, grad_output: tuple[Tensor, ...]) -> None:
        inputs = self.inputs.pop()
        backprops = grad_output[0].detach() * inputs.shape[0]  # undo the batch mean: the grad of each example's loss
        params = {n: p for n, p in module.named_parameters() if p.requires_grad}
        buffers = dict(module.named_buffers())

        def inner_product(weights: dict[str, Tensor], x: Tensor, g: Tensor) -> Tensor:
            out = functional_call(self.replica, ({**weights, **buffers},), (x.unsqueeze(0),))
            return (out * g.unsqueeze(0)).sum()

        detached = {n: p.detach() for n, p in params.items()}
        per_example = vmap(grad(inner_product), in_dims=(None, 0, 0))(detached, inputs, backprops)
        for name, p in params.items():
            previous = getattr(p, "grad_sample", None)
            sample = per_example[name]
            if previous is None:
                p.grad_sample = sample
            else:  # gradient accumulation over several batches: a list, as Opacus keeps it
                p.grad_sample = [*previous, sample] if isinstance(previous, list) else [previous, sample]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.inputs.clear()


def _is_unit(module: nn.Module) -> bool:
    return bool(getattr(module, "per_example_unit", False))


class _UnitAwareGradSampleModule(GradSampleModule):
    """Opacus' per-sample-gradient hooks everywhere except inside layers marked ``per_example_unit``."""

    @override
    def iterate_submodules(self, module: nn.Module) -> Iterator[nn.Module]:
        if _is_unit(module):
            return
        yield from super().iterate_submodules(module)


def _check_no_batch_norm(module: nn.Module) -> None:
    """Raise if a BatchNorm would mix the examples of a batch, with the fix for its kind of layer."""
    units = [name for name, m in module.named_modules() if _is_unit(m)]
    for name, m in module.named_modules():
        if not isinstance(m, nn.modules.batchnorm._BatchNorm):
            continue
        owner = next((unit for unit in units if name.startswith(f"{unit}.")), None)
        if owner is not None:
            raise ValueError(
                f"PerExampleDP: the layer {owner} ({type(module.get_submodule(owner)).__name__}) normalises with "
                "BatchNorm, which mixes the examples of a batch; build it with norm='group' (add_keylock(..., "
                "norm='group'), KeyLocks(norm='group'))."
            )
        raise ValueError(
            f"PerExampleDP cannot compute per-example gradients through BatchNorm {name}: it mixes the examples "
            "of a batch; before training call `model = opacus.validators.ModuleValidator.fix(model)` (GroupNorm)."
        )


class PerExampleDP(L.Callback):
    r"""Per-example gradient clipping and Gaussian noise at every optimiser step (DP-SGD), via Opacus.

    Add it to any Trainer: ``L.Trainer(callbacks=[PerExampleDP(noise_multiplier=1.0, max_grad_norm=1.0)])``.
    At ``on_train_start`` it attaches Opacus' per-sample-gradient hooks to the module and replaces the
    (single) optimiser by a ``DPOptimizer``; at ``on_train_end`` it restores both, so the module is
    unchanged and can be trained again (by another client) with or without DP. The defaults are the DP-SGD of
    Abadi et al. as Opacus' ``make_private`` runs it: flat clipping to C and one draw of
    :math:`\mathcal N(0, \sigma^2C^2)` on the batch's summed clipped gradient, divided by B.

    It logs ``epsilon`` (at ``delta``), ``delta``, ``noise_multiplier`` and ``max_grad_norm`` with
    ``pl_module.log`` every ``Trainer(log_every_n_steps)`` optimiser steps and at the end of every epoch, so they
    reach ``trainer.callback_metrics`` and the Trainer's logger (an RDP epsilon takes milliseconds to compute,
    so not every step). Its accountant is saved in Lightning checkpoints (``state_dict``) and restored on
    resume, so epsilon keeps counting across ``Trainer.fit(ckpt_path=...)``.

    With ``clipping="per_layer"`` and ``noise_scaling="per_example"`` it implements lines 8-15 of Alg. 2
    (Fed-CDP) of Wei et al. (ICDCS 2021):
    :math:`\bar g_{j,m} = g_{j,m}/\max(1, \|g_{j,m}\|_2/C)`,
    :math:`\tilde g = \frac1B\sum_j(\bar g_j + \mathcal N(0,\sigma^2C^2 I))`; with ``clipping="flat"`` and
    ``noise_scaling="per_batch"`` (the defaults) it is the DP-SGD that 2DP-FL (Xiong et al., IEEE TII 2021,
    Alg. 1) runs on its clients.

    Passport (:class:`~lightning_fl.defences.PassportConv2d`) and key-lock
    (:class:`~lightning_fl.defences.KeyLockNorm2d`) layers are differentiated per example as whole layers with
    ``torch.func`` (they mark themselves ``per_example_unit = True``; a user's layer may do the same); their
    private parameters are clipped and noised like any other and stay private.

    Inferred: batches are the loader's shuffled batches (as in the papers' code), while the accountant assumes
    Poisson sampling at rate B/n (spec B12-3). The released gradient (``release``) is the noised batch
    average that the optimiser applies; with B = 1 it is exactly the per-example sanitised gradient that
    Fed-CDP's type-2 attacker sees.

    Args:
        noise_multiplier: :math:`\sigma`, noise std relative to the clip bound (Fed-CDP uses 6).
        max_grad_norm: clip bound C for each per-example gradient (each parameter tensor with
            ``clipping="per_layer"``, the whole gradient with ``"flat"``).
        clipping: ``flat`` (standard DP-SGD) or ``per_layer`` (Fed-CDP).
        noise_scaling: ``per_batch`` (one draw per batch: std :math:`\sigma C/B` on the mean; DP-SGD, Opacus,
            Fed-CDP's released code) or ``per_example`` (one draw per example: std :math:`\sigma C/\sqrt B` on the
            mean; Fed-CDP Alg. 2 line 14); see :data:`NoiseScaling`.
        delta: :math:`\delta` of the logged :math:`(\epsilon, \delta)`.
        accountant: Opacus accountant recording each step (``rdp`` or ``prv``).
        conversion: RDP to (epsilon, delta) conversion (see :class:`PrivacyAccountant`).
        accounting_noise: the multiplier the accountant records: ``nominal`` is :math:`\sigma` as the papers
            account it; ``effective`` is the multiplier relative to the whole-gradient sensitivity that is
            really added (:func:`opacus_noise_multiplier`), sound for per-layer clipping.
        seed: seed of the noise generator (``None``: the global torch RNG).

    Raises:
        ValueError: on a non-positive clip bound, negative noise, a delta outside (0, 1) or an unknown option;
            at ``fit``, on a model with BatchNorm or more than one optimiser.

    Example:
        >>> dp = PerExampleDP(noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5)
        >>> trainer = L.Trainer(callbacks=[dp], max_epochs=1, logger=False, enable_progress_bar=False)
        >>> dp.state_dict()
        {'accountant': {'history': []}}
    """

    def __init__(
        self,
        *,
        noise_multiplier: float = 1.0,
        max_grad_norm: float = 1.0,
        clipping: Clipping = "flat",
        noise_scaling: NoiseScaling = "per_batch",
        delta: float = 1e-5,
        accountant: AccountantName = "rdp",
        conversion: Conversion = "improved",
        accounting_noise: AccountingNoise = "nominal",
        seed: int | None = None,
    ) -> None:
        check_non_negative(noise_multiplier, owner="PerExampleDP", name="noise_multiplier")
        check_positive(max_grad_norm, owner="PerExampleDP", name="max_grad_norm", hint="; it is the clip bound C")
        if clipping not in ("per_layer", "flat"):
            raise ValueError(f"PerExampleDP(clipping={clipping!r}) is unknown; use 'flat' or 'per_layer'.")
        if noise_scaling not in ("per_batch", "per_example"):
            raise ValueError(
                f"PerExampleDP(noise_scaling={noise_scaling!r}) is unknown; use 'per_batch' (one noise draw per "
                "batch, DP-SGD) or 'per_example' (one per example, Fed-CDP Alg. 2)."
            )
        if not 0 < delta < 1:
            raise ValueError(f"PerExampleDP(delta={delta}) must be in (0, 1); 1/n for n training samples is usual.")
        if accounting_noise not in ("nominal", "effective"):
            raise ValueError(
                f"PerExampleDP(accounting_noise={accounting_noise!r}) is unknown; use 'nominal' or 'effective'."
            )
        self.noise_multiplier, self.max_grad_norm = noise_multiplier, max_grad_norm
        self.clipping, self.noise_scaling, self.accounting_noise = clipping, noise_scaling, accounting_noise
        self.delta, self.seed = delta, seed
        self.privacy_accountant = PrivacyAccountant(accountant, conversion=conversion)
        self.release: Release | None = None
        self.sample_rate: float | None = None
        self._gsm: GradSampleModule | None = None
        self._units: list[_UnitGradSampler] = []
        self._batch: Any = None
        self._names: dict[torch.Tensor, str] = {}
        self._module: L.LightningModule | None = None
        self._epsilon_cache: tuple[Any, float] = (None, 0.0)

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
        if self.privacy_accountant.history and trainer.global_step % trainer.log_every_n_steps == 0:
            pl_module.log_dict(self._privacy_metrics(), on_step=True, on_epoch=False)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.privacy_accountant.history:
            pl_module.log_dict(self._privacy_metrics(), on_step=False, on_epoch=True)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._detach(trainer, pl_module)

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._detach(trainer, pl_module)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"accountant": self.privacy_accountant.state_dict()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "accountant" not in state_dict:
            raise KeyError(f"PerExampleDP checkpoint state needs an 'accountant' entry; got keys {sorted(state_dict)}.")
        self.privacy_accountant.load_state_dict(state_dict["accountant"])

    def epsilon(self) -> float:
        """:math:`\\epsilon` spent so far at :attr:`delta` (0 before any step); recomputed only after new steps."""
        key = (id(self.privacy_accountant), tuple(self.privacy_accountant.history), self.delta)
        if key != self._epsilon_cache[0]:
            self._epsilon_cache = (key, self.privacy_accountant.get_epsilon(self.delta))
        return self._epsilon_cache[1]

    def _privacy_metrics(self) -> dict[str, float]:
        return {
            "epsilon": self.epsilon(),
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
        }

    # -- attach / detach -----------------------------------------------------------------------------------
    def _attach(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"PerExampleDP supports exactly one optimizer, {type(pl_module).__name__}.configure_optimizers "
                f"returned {len(trainer.optimizers)}."
            )
        _check_no_batch_norm(pl_module)
        loader = trainer.train_dataloader
        batch_size = getattr(loader, "batch_size", None)
        if not batch_size:
            raise ValueError("PerExampleDP needs a train DataLoader with a fixed `batch_size` (the expected batch B).")
        optimizer = trainer.optimizers[0]
        params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        self._gsm = _UnitAwareGradSampleModule(pl_module, loss_reduction="mean")
        self._units = [_UnitGradSampler(m) for m in pl_module.modules() if _is_unit(m)]
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
            "generator": None if self.seed is None else torch.Generator(pl_module.device).manual_seed(self.seed),
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
        for unit in self._units:
            unit.remove()
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
        self._gsm, self._units, self._names, self._module, self._batch = None, [], {}, None, None

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
        noise_scaling: ``per_batch`` or ``per_example`` (see :data:`NoiseScaling`).
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
        noise_scaling: NoiseScaling = "per_batch",
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
            delta=delta,
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
                sample_rate=self._federation_sample_rate(spec),
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
                sample_rate=self._federation_sample_rate(loop.spec),
                steps=self._federation_steps(loop.spec),
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
