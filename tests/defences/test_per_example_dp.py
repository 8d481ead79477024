"""Fed-CDP / PerExampleDP: Opacus inside a Lightning Trainer, on the loop's shared worker, with the right noise."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_fl import FederatedLoop
from lightning_fl.attacks import IDLGAttack
from lightning_fl.callbacks import FederatedCallback, GradientLeakage
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import ClientDPSGD, Defence, FedCDP, FedSDP, PerExampleDP
from lightning_fl.federation.checkpoint import Checkpoint
from lightning_fl.models import ImageClassifier
from lightning_fl.privacy import PrivacyAccountant, Schedule
from lightning_fl.server import FedAvg
from tests.conftest import make_classifier, one_step_attack_loop

_TRAINER = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
_TRAINER |= {"enable_model_summary": False, "accelerator": "cpu"}


class Linear(L.LightningModule):
    """A linear regression with an SGD step size we choose (0 freezes the weights)."""

    def __init__(self, lr: float = 0.0) -> None:
        super().__init__()
        self.net, self.lr = nn.Linear(3, 2), lr
        self.released: list[dict[str, Tensor]] = []

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return F.mse_loss(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _fit(model: L.LightningModule, callbacks: list, *, n: int = 8, batch: int = 8, steps: int = 1) -> None:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, 3, generator=g), torch.randn(n, 2, generator=g))
    loader = DataLoader(data, batch_size=batch, shuffle=False)
    L.Trainer(max_steps=steps, callbacks=callbacks, **_TRAINER).fit(model, loader)


def _recording_dp(**kwargs) -> tuple[PerExampleDP, list[dict[str, Tensor]]]:
    released: list[dict[str, Tensor]] = []
    dp = PerExampleDP(seed=0, **kwargs)
    dp.release = lambda model, grads, batch, opt: released.append({k: g.clone() for k, g in grads.items()})
    return dp, released


@pytest.mark.parametrize(
    ("clipping", "scaling", "expected_std"),
    [
        ("per_layer", "per_example", 2.0 * 0.5 / 8**0.5),
        ("per_layer", "per_batch", 2.0 * 0.5 / 8),
        ("flat", "per_example", 0.5 / 8**0.5),
        ("flat", "per_batch", 0.5 / 8),
    ],
)
def test_released_noise_has_the_named_scale(clipping: str, scaling: str, expected_std: float) -> None:
    sigma = 2.0 if clipping == "per_layer" else 1.0
    dp, released = _recording_dp(noise_multiplier=sigma, max_grad_norm=0.5, clipping=clipping, noise_scaling=scaling)
    _fit(Linear(lr=0.0), [dp], steps=400)
    weights = torch.stack([r["net.weight"] for r in released])
    assert weights.std(dim=0).mean() == pytest.approx(expected_std, rel=0.08)


def test_without_noise_and_clipping_dp_sgd_equals_plain_sgd() -> None:
    torch.manual_seed(0)
    plain, private = Linear(lr=0.1), Linear(lr=0.1)
    private.load_state_dict(plain.state_dict())
    _fit(plain, [], n=16, batch=4, steps=4)
    _fit(
        private,
        [PerExampleDP(noise_multiplier=0.0, max_grad_norm=1e6, sampling="shuffled_batches")],
        n=16,
        batch=4,
        steps=4,
    )
    for a, b in zip(plain.parameters(), private.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_per_layer_clipping_bounds_every_example_and_layer() -> None:
    dp, released = _recording_dp(
        noise_multiplier=0.0, max_grad_norm=0.05, clipping="per_layer", sampling="shuffled_batches"
    )
    _fit(Linear(lr=0.0), [dp], n=8, batch=1, steps=8)  # batch 1: the release is one example's gradient
    assert all(g.norm() <= 0.05 * (1 + 1e-4) for r in released for g in r.values())
    assert any(g.norm() >= 0.049 for r in released for g in r.values())


def test_the_module_is_left_as_found_and_reusable_without_dp() -> None:
    model = Linear(lr=0.1)
    dp = PerExampleDP(noise_multiplier=1.0, max_grad_norm=1.0)
    _fit(model, [dp], n=16, batch=4, steps=2)
    hooks = [m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules()]
    assert not any(hooks)
    assert not any(hasattr(p, "grad_sample") or hasattr(p, "summed_grad") for p in model.parameters())
    twin = Linear(lr=0.1)
    twin.load_state_dict(model.state_dict())
    _fit(model, [], n=16, batch=4, steps=2)
    _fit(twin, [], n=16, batch=4, steps=2)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters(), strict=True))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_grad_norm": 0.0}, "clip bound"),
        ({"clipping": "per_example"}, "clipping"),
        ({"noise_scaling": "paper"}, "'per_batch' .*or 'per_example'"),
        ({"delta": 1.0}, r"delta=1.0\) must be in \(0, 1\)"),
    ],
)
def test_per_example_dp_rejects_bad_options(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PerExampleDP(**kwargs)


# -- in the federated loop -------------------------------------------------------------------------------------
def _loop(tmp_path: Path, parts: list, *, num_rounds: int = 2, **kwargs) -> FederatedLoop:
    """A loop with the defence bundles in ``parts`` as defences and the rest as callbacks."""
    dm = FederatedDataModule("digits", num_clients=4, partition="iid", image_size=16, batch_size=16, seed=0)
    torch.manual_seed(0)
    options = {"clients_per_round": 2, "local_steps": 3, "eval_every": 0, "progress_bar": False} | kwargs
    defences = [p for p in parts if isinstance(p, Defence)]
    callbacks = [p for p in parts if not isinstance(p, Defence)]
    return FederatedLoop(
        make_classifier(dm),
        dm,
        num_rounds=num_rounds,
        defences=defences,
        callbacks=callbacks,
        output_dir=tmp_path,
        **options,
    )


def test_client_accountants_persist_per_client_and_resume(tmp_path: Path) -> None:
    full = _loop(tmp_path / "full", [FedCDP(noise_multiplier=1.0)], num_rounds=3).fit()
    _loop(tmp_path / "resumed", [FedCDP(noise_multiplier=1.0)], num_rounds=2).fit()
    resumed_loop = _loop(tmp_path / "resumed", [FedCDP(noise_multiplier=1.0)], num_rounds=3)
    resumed = resumed_loop.fit(resume=True)
    epsilons = [h["epsilon"] for h in full["history"]]
    assert epsilons == [h["epsilon"] for h in resumed["history"]]
    assert (
        epsilons[0] < epsilons[-1] or len(set(full["history"][0]["clients"]) & set(full["history"][-1]["clients"])) == 0
    )
    trained = {k for h in full["history"] for k in h["clients"]}
    accountant = PrivacyAccountant()
    extra = resumed_loop.clients[sorted(trained)[0]].extra
    accountant.load_state_dict(extra[ClientDPSGD.extra_key])
    times = sum(sorted(trained)[0] in h["clients"] for h in full["history"])
    assert accountant.history == [(1.0, 16 / resumed_loop.datamodule.num_train_samples(sorted(trained)[0]), 3 * times)]
    worker = (
        resumed_loop.runner.worker
    )  # one LightningModule for all clients: no Opacus hooks or per-sample state left on it
    assert not any(m._forward_hooks or m._backward_hooks for m in worker.modules())
    assert not any(hasattr(p, "grad_sample") for p in worker.parameters())
    server = torch.load(Checkpoint(tmp_path / "full").server_path, weights_only=True)
    assert ClientDPSGD.extra_key not in str(server["callbacks"])


def test_federation_accounting_counts_every_round_at_the_federation_rate(tmp_path: Path) -> None:
    cdp = FedCDP(noise_multiplier=6.0, accounting="federation", steps_offset=1, conversion="classic")
    loop = _loop(tmp_path, [cdp], num_rounds=2, checkpoint=False)
    summary = loop.fit()
    total = sum(loop.datamodule.num_train_samples(k) for k in range(4))
    expected = PrivacyAccountant(conversion="classic")
    expected.step(noise_multiplier=6.0, sample_rate=16 * 2 / total, steps=1 + 2 * 3)
    assert summary["history"][-1]["epsilon"] == pytest.approx(expected.get_epsilon(1e-5))


def test_decay_schedule_sets_the_clip_bound_per_round(tmp_path: Path) -> None:
    cdp = FedCDP(noise_multiplier=1.0, max_grad_norm=Schedule(6.0, end=2.0, kind="linear", num_rounds=3))
    summary = _loop(tmp_path, [cdp], num_rounds=3, checkpoint=False).fit()
    assert [h["clip_bound"] for h in summary["history"]] == [6.0, 4.0, 2.0]


class _Released(FederatedCallback):
    def __init__(self) -> None:
        self.gradients: list[dict[str, Tensor]] = []

    def on_local_gradient(self, loop, view, ground_truth) -> None:
        self.gradients.append(view.tensors)


def test_the_type_2_leak_point_sees_the_noised_gradient_the_client_applies(tmp_path: Path) -> None:
    released = _Released()
    loop = _loop(tmp_path, [FedCDP(noise_multiplier=1.0), released], num_rounds=1, local_steps=1, checkpoint=False)
    loop.global_model.optimizer_name, loop.global_model.lr = "sgd", 0.5
    before = {k: v.clone() for k, v in loop.global_public_state().items()}
    loop.fit()
    assert len(released.gradients) == 2  # one step per client, one emission each (the default tap is off)
    applied = {k: (loop.global_public_state()[k] - before[k]) for k in before}  # mean of the two clients' -lr*g
    mean_released = {k: sum(g[k] for g in released.gradients) / 2 for k in before}
    n = [loop.datamodule.num_train_samples(k) for k in loop.history[0]["clients"]]
    weighted = {k: (n[0] * released.gradients[0][k] + n[1] * released.gradients[1][k]) / sum(n) for k in before}
    assert all(torch.allclose(applied[k], -0.5 * weighted[k], atol=1e-5) for k in before)
    assert mean_released  # noise dominates: the released gradient is far from the raw one
    assert max(g.abs().max() for g in released.gradients[0].values()) > 1.0


def _attacked(tmp_path: Path, defences: list) -> dict:
    attack = GradientLeakage(
        IDLGAttack(max_iterations=300, progress_bar=False), leak_point="local_gradient", save_images=False
    )
    loop = one_step_attack_loop(tmp_path, callbacks=[attack], defences=defences)
    return loop.fit()["attacks"][0]


def test_type_2_leakage_succeeds_without_dp_and_under_fed_sdp_and_fails_under_fed_cdp(tmp_path: Path) -> None:
    """Fed-CDP Table VII, type 2 (tiny scale): per-example noise hides the local gradient, update noise does not.

    The attack infers the label analytically (iDLG), as Fed-CDP's CPL attack does for one example (spec B9).
    """
    plain = _attacked(tmp_path / "plain", [])
    sdp = _attacked(tmp_path / "sdp", [FedSDP()])
    cdp = _attacked(tmp_path / "cdp", [FedCDP(sampling="shuffled_batches")])  # the paper's fixed B = 1
    assert plain["psnr"] >= 30 and sdp["psnr"] >= 30
    assert cdp["psnr"] < 15 and cdp["mse"] > 0.05


def _fed_cdp_accuracy(tmp_path: Path, clip: float | Schedule) -> float:
    dm = FederatedDataModule("digits", num_clients=4, partition="iid", image_size=16, batch_size=16, seed=0)
    torch.manual_seed(0)
    loop = FederatedLoop(
        make_classifier(dm, optimizer="sgd", lr=0.1),
        dm,
        num_rounds=10,
        clients_per_round=4,
        local_epochs=1,
        eval_every=10,
        defences=[FedCDP(noise_multiplier=3.0, max_grad_norm=clip, noise_scaling="per_batch")],
        aggregator=FedAvg(weighted=False),
        output_dir=tmp_path,
        checkpoint=False,
        progress_bar=False,
    )
    return loop.fit()["test_accuracy"]


def test_decaying_the_clip_bound_beats_a_constant_one_at_equal_epsilon(tmp_path: Path) -> None:
    """Fed-CDP Table II direction: Fed-CDP(decay) C 6 -> 2 >= Fed-CDP C = 4 (same sigma, so the same epsilon)."""
    constant = _fed_cdp_accuracy(tmp_path / "constant", 4.0)
    decay = _fed_cdp_accuracy(tmp_path / "decay", Schedule(6.0, end=2.0, kind="linear", num_rounds=10))
    assert decay >= constant + 0.05
    assert constant > 0.2  # both learn something; the decay wins on noise, not on luck


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"accounting": "global"}, "'per_client' or 'federation'"),
        ({"delta": 0.0}, "delta"),
        ({"steps_offset": -1}, ">= 0"),
    ],
)
def test_fed_cdp_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FedCDP(**kwargs)


def test_fed_cdp_trains_a_passport_model_in_the_loop_and_keeps_passports_private(tmp_path: Path) -> None:
    from lightning_fl.defences import Passports

    dm = FederatedDataModule("digits", num_clients=4, partition="iid", image_size=16, batch_size=16, seed=0)
    torch.manual_seed(0)
    model = ImageClassifier("lenet_dlg", **dm.model_options)
    recorder = _Updates()
    loop = FederatedLoop(
        model,
        dm,
        num_rounds=1,
        clients_per_round=2,
        local_steps=3,
        eval_every=0,
        defences=[Passports(num_convs=1, passport_size=16), FedCDP(noise_multiplier=1.0, noise_scaling="per_batch")],
        callbacks=[recorder],
        output_dir=tmp_path,
        checkpoint=False,
        progress_bar=False,
    )
    summary = loop.fit()
    assert summary["history"][0]["epsilon"] > 0 and len(recorder.updates) == 2
    assert all(not any("passport" in k or ".encoder." in k for k in u.delta) for u in recorder.updates)


class _Updates(FederatedCallback):
    def __init__(self) -> None:
        self.updates: list = []

    def on_client_fit_end(self, loop, update) -> None:
        self.updates.append(update)
