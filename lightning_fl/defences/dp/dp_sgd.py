"""Per-example DP-SGD inside any Lightning Trainer: the :class:`PerExampleDP` callback (Opacus).

It wraps the module's parameters in Opacus' ``GradSampleModule`` hooks and the optimiser in Opacus'
``DPOptimizer`` for one ``fit`` and removes both afterwards, so it works with any ``LightningModule`` and with the
one worker model that the :class:`~lightning_fl.federation.ClientRunner` reuses for every client.

References:
    Abadi et al., "Deep Learning with Differential Privacy", CCS 2016. Wei et al., ICDCS 2021, arXiv:2107.01154.
    Opacus: Yousefpour et al., arXiv:2109.12298.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.types import STEP_OUTPUT
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer, DPPerLayerOptimizer
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_fl.defences.dp.opacus_hooks import (
    Clipping,
    NoiseScaling,
    UnitAwareGradSampleModule,
    UnitGradSampler,
    check_per_example_model,
    is_unit,
    opacus_noise_multiplier,
    strip_opacus_state,
)
from lightning_fl.privacy.accounting import AccountantName, Conversion, PrivacyAccountant
from lightning_fl.privacy.sampling import PoissonBatchSampler, poisson_loader
from lightning_fl.validation import check_non_negative, check_positive

if TYPE_CHECKING:
    from lightning_fl.messages import GradientRelease

__all__ = ["AccountingNoise", "DPSGDPlan", "PerExampleDP", "Sampling", "check_dp_sgd_options"]

AccountingNoise = Literal["nominal", "effective"]
Sampling = Literal["poisson", "shuffled_batches"]

_CHOICES: dict[str, tuple[Any, str]] = {
    "clipping": (Clipping, "use 'flat' or 'per_layer'"),
    "noise_scaling": (
        NoiseScaling,
        "use 'per_batch' (one noise draw per batch, DP-SGD) or 'per_example' (one per example, Fed-CDP Alg. 2)",
    ),
    "accounting_noise": (AccountingNoise, "use 'nominal' or 'effective'"),
    "sampling": (
        Sampling,
        "use 'poisson' (what the accountant assumes) or 'shuffled_batches' (the loader's fixed-size batches)",
    ),
}
"""Per option of :class:`PerExampleDP` with a fixed set of values: its type (a ``Literal``) and the fix a message
gives."""


def check_dp_sgd_options(
    owner: str,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    clipping: str,
    noise_scaling: str,
    delta: float,
    accounting_noise: str,
    sampling: str,
) -> None:
    """Check the DP-SGD arguments of :class:`PerExampleDP` and of the defences that run it (STYLE.md R3).

    ``owner`` is the class the arguments were given to, named in the message; the other arguments are
    :class:`PerExampleDP`'s (``max_grad_norm`` of the first round, for a schedule).

    Raises:
        ValueError: ``<owner>(<name>=<value>)`` with the rule and the allowed values.

    Example:
        >>> check_dp_sgd_options("FedCDP", noise_multiplier=6.0, max_grad_norm=4.0, clipping="per_layer",
        ...     noise_scaling="per_batch", delta=0.0, accounting_noise="nominal", sampling="poisson")
        Traceback (most recent call last):
        ...
        ValueError: FedCDP(delta=0.0) must be in (0, 1); 1/n for n training samples is usual.
    """
    check_non_negative(noise_multiplier, owner=owner, name="noise_multiplier")
    check_positive(max_grad_norm, owner=owner, name="max_grad_norm", hint="; it is the clip bound C")
    if not 0 < delta < 1:
        raise ValueError(f"{owner}(delta={delta}) must be in (0, 1); 1/n for n training samples is usual.")
    chosen = {"clipping": clipping, "noise_scaling": noise_scaling, "accounting_noise": accounting_noise}
    for name, value in {**chosen, "sampling": sampling}.items():
        allowed, hint = _CHOICES[name]
        if value not in get_args(allowed):
            raise ValueError(f"{owner}({name}={value!r}) is unknown; {hint}.")


@dataclass(frozen=True)
class DPSGDPlan:
    r"""The numbers of one DP-SGD fit of :class:`PerExampleDP`, in Opacus' convention.

    Args:
        noise_multiplier: the multiplier Opacus is given (:func:`opacus_noise_multiplier`).
        noise_std: std of the one Gaussian draw per parameter tensor added to the summed clipped per-example
            gradients of a step (``noise_multiplier`` times the whole-gradient clip norm: :math:`C` flat,
            :math:`C\sqrt M` per layer); the sum is then divided by ``batch_size``.
        accounting_multiplier: the multiplier the accountant records at each step.
        sample_rate: :math:`q` the accountant records at each step.
        batch_size: the expected batch size :math:`B` the noised sum is divided by.
    """

    noise_multiplier: float
    noise_std: float
    accounting_multiplier: float
    sample_rate: float
    batch_size: int


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

    Sampling (``sampling``): the accountant assumes Poisson sampling, each example joining a batch independently with
    probability :math:`q = B/n` (Abadi et al., Sec. 3.1; the RDP analysis of Mironov et al.). By default
    (``"poisson"``) the callback replaces the Trainer's shuffled fixed-size batches by such batches
    (:func:`~lightning_fl.privacy.poisson_loader`, same number of steps per epoch, the batch size B only on
    average), so the recorded :math:`q` is the loader's. ``"shuffled_batches"`` keeps the loader's batches, as the
    papers' code does; epsilon is then still computed at :math:`q = B/n` and is not a proven bound for that run,
    which the federation's ``summary.json["privacy"]`` says. The released gradient (``release``) is
    the noised batch average that the optimiser applies; with B = 1 it is exactly the per-example sanitised
    gradient that Fed-CDP's type-2 attacker sees.

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
        sampling: ``poisson`` (default: batches drawn as the accountant assumes) or ``shuffled_batches`` (the
            loader's fixed-size batches; epsilon then assumes Poisson sampling the run did not use).
        seed: seed of the noise generator and of the Poisson sampling (``None``: the global torch RNG).

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
        sampling: Sampling = "poisson",
        seed: int | None = None,
    ) -> None:
        check_dp_sgd_options(
            "PerExampleDP",
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            clipping=clipping,
            noise_scaling=noise_scaling,
            delta=delta,
            accounting_noise=accounting_noise,
            sampling=sampling,
        )
        self.noise_multiplier, self.max_grad_norm = noise_multiplier, max_grad_norm
        self.sampling = sampling
        self.clipping, self.noise_scaling, self.accounting_noise = clipping, noise_scaling, accounting_noise
        self.delta, self.seed = delta, seed
        self.privacy_accountant = PrivacyAccountant(accountant, conversion=conversion)
        self.release: GradientRelease | None = None
        self.sample_rate: float | None = None
        self._gsm: GradSampleModule | None = None
        self._units: list[UnitGradSampler] = []
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
        check_per_example_model(pl_module)
        loader = trainer.train_dataloader
        if isinstance(getattr(loader, "batch_sampler", None), PoissonBatchSampler):  # a Trainer fitted again
            sample_rate = loader.batch_sampler.sample_rate
            batch_size = max(1, round(sample_rate * len(loader.dataset)))
        else:
            fit_loader, batch_size, sample_rate = self.fit_loader(loader)
            if fit_loader is not loader:
                _use_train_loader(trainer, fit_loader)
        optimizer = trainer.optimizers[0]
        params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        self._gsm = UnitAwareGradSampleModule(pl_module, loss_reduction="mean")
        self._units = [UnitGradSampler(m) for m in pl_module.modules() if is_unit(m)]
        plan = self.fit_plan(batch_size=batch_size, sample_rate=sample_rate, num_tensors=len(params))
        options = {
            "noise_multiplier": plan.noise_multiplier,
            "expected_batch_size": batch_size,
            "generator": self.noise_generator(pl_module.device),
        }
        if self.clipping == "per_layer":
            dp_optimizer = DPPerLayerOptimizer(optimizer, max_grad_norm=[self.max_grad_norm] * len(params), **options)
        else:
            dp_optimizer = DPOptimizer(optimizer, max_grad_norm=self.max_grad_norm, **options)
        dp_optimizer.attach_step_hook(lambda opt: self._on_dp_step(opt, plan.accounting_multiplier, sample_rate))
        trainer.strategy.optimizers = [dp_optimizer]
        self._names = {p: n for n, p in pl_module.named_parameters()}
        self._module = pl_module

    def fit_loader(self, loader: DataLoader) -> tuple[DataLoader, int, float]:
        """The loader one fit trains on (``loader``'s Poisson form with ``sampling="poisson"``, drawn from
        :meth:`sampling_generator`, else ``loader``), its expected batch size B and its sampling rate q
        (``sample_rate``, else B / n).

        Raises:
            ValueError: when ``loader`` has no fixed ``batch_size``.
        """
        batch_size = getattr(loader, "batch_size", None)
        if not batch_size:
            raise ValueError("PerExampleDP needs a train DataLoader with a fixed `batch_size` (the expected batch B).")
        sample_rate = self.sample_rate or batch_size / len(loader.dataset)
        if self.sampling == "poisson":
            loader = poisson_loader(loader, sample_rate=sample_rate, generator=self.sampling_generator())
        return loader, batch_size, sample_rate

    def fit_plan(self, *, batch_size: int, sample_rate: float, num_tensors: int) -> DPSGDPlan:
        """The numbers of one fit at the current settings, with expected batch ``batch_size``, sampling rate
        ``sample_rate`` and ``num_tensors`` trained parameter tensors."""
        multiplier = opacus_noise_multiplier(
            noise_multiplier=self.noise_multiplier,
            clipping=self.clipping,
            noise_scaling=self.noise_scaling,
            num_tensors=num_tensors,
            batch_size=batch_size,
        )
        total = self.max_grad_norm  # the whole-gradient clip norm, computed per layer as DPPerLayerOptimizer does
        if self.clipping == "per_layer":
            total = torch.norm(torch.Tensor([self.max_grad_norm] * num_tensors), p=2).item()
        accounting = multiplier if self.accounting_noise == "effective" else self.noise_multiplier
        return DPSGDPlan(multiplier, multiplier * total, accounting, sample_rate, batch_size)

    def noise_generator(self, device: torch.device) -> torch.Generator | None:
        """A fresh generator of the fit's Gaussian noise on ``device`` (``None`` without a seed: the global RNG)."""
        return None if self.seed is None else torch.Generator(device).manual_seed(self.seed)

    def sampling_generator(self) -> torch.Generator | None:
        """A fresh generator of the fit's Poisson batches (``None`` without a seed: the global RNG)."""
        if self.seed is None:
            return None
        return torch.Generator().manual_seed(int(np.random.SeedSequence([self.seed, 1]).generate_state(1)[0]))

    def _detach(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._gsm is None:
            return
        self._gsm.remove_hooks()
        for unit in self._units:
            unit.remove()
        strip_opacus_state(pl_module)
        dp_optimizer = trainer.strategy.optimizers[0]
        if isinstance(dp_optimizer, DPOptimizer):
            trainer.strategy.optimizers = [dp_optimizer.original_optimizer]
        self._gsm, self._units, self._names, self._module, self._batch = None, [], {}, None, None

    def _on_dp_step(self, optimizer: DPOptimizer, noise_multiplier: float, sample_rate: float) -> None:
        """Opacus step hook: the noised gradient is in ``p.grad`` now, right before the inner step.

        An empty Poisson batch still adds noise and is accounted; it releases nothing (no example to attack).
        """
        self.privacy_accountant.step(noise_multiplier=noise_multiplier, sample_rate=sample_rate)
        if self.release is not None and self._module is not None and extract_batch_size(self._batch) > 0:
            gradients = {self._names[p]: p.grad for p in optimizer.params if p.grad is not None}
            self.release(self._module, gradients, self._batch, optimizer)


def _use_train_loader(trainer: L.Trainer, loader: DataLoader) -> None:
    """Make ``loader`` the train loader of the fit that is starting.

    Lightning builds the loader's iterator before ``on_train_start``; the fit loop's combined loader takes the new
    loader and its data fetcher restarts from it (the same length, so the epoch's step count is unchanged).
    """
    fit_loop = trainer.fit_loop
    combined = fit_loop._combined_loader
    if combined is None or len(combined.flattened) != 1:
        raise ValueError("PerExampleDP(sampling='poisson') needs exactly one train DataLoader.")
    combined.flattened = [loader]
    fit_loop._data_fetcher.setup(combined)
    iter(fit_loop._data_fetcher)
