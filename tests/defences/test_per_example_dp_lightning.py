"""PerExampleDP as a plain Lightning callback on a user's project: logged epsilon, resumable accountant, BatchNorm,
and DP-SGD through passport and key-lock layers (exact per-example gradients, above-chance accuracy)."""

from __future__ import annotations

import copy
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from opacus.accountants import RDPAccountant
from opacus.validators import ModuleValidator
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_fl.defences import PerExampleDP, add_keylock, add_passports
from lightning_fl.private import private_state
from tests.user_project import DigitsNet, digits_tensors

_QUIET = {"enable_progress_bar": False, "enable_model_summary": False, "accelerator": "cpu"}


def _loaders(batch_size: int = 32, *, shuffle: bool = True, n: int = 1500) -> tuple[DataLoader, DataLoader]:
    x, y = digits_tensors()
    train = DataLoader(TensorDataset(x[:n], y[:n]), batch_size=batch_size, shuffle=shuffle)
    return train, DataLoader(TensorDataset(x[1500:], y[1500:]), batch_size=512)


def _defended(defence: str) -> DigitsNet:
    torch.manual_seed(0)
    model = DigitsNet(lr=0.1)
    if defence == "passport":
        add_passports(model, num_convs=1, passport_size=8)
    elif defence == "keylock":
        add_keylock(model, key_length=64, norm="group")
    return model


def test_epsilon_reaches_callback_metrics_and_the_logger_and_equals_an_independent_accountant(tmp_path: Path) -> None:
    train, _ = _loaders()
    dp = PerExampleDP(noise_multiplier=1.1, max_grad_norm=1.0, delta=1e-4, seed=0)
    trainer = L.Trainer(
        max_steps=6,
        callbacks=[dp],
        logger=CSVLogger(tmp_path),
        log_every_n_steps=1,
        enable_checkpointing=False,
        **_QUIET,
    )
    trainer.fit(DigitsNet(), train)
    lines = (Path(trainer.logger.log_dir) / "metrics.csv").read_text().splitlines()
    reference = RDPAccountant()
    for _ in range(6):
        reference.step(noise_multiplier=1.1, sample_rate=32 / 1500)
    expected = reference.get_epsilon(delta=1e-4)
    assert trainer.callback_metrics["epsilon"].item() == pytest.approx(expected, rel=1e-5)
    assert trainer.callback_metrics["delta"].item() == pytest.approx(1e-4)
    assert trainer.callback_metrics["noise_multiplier"].item() == pytest.approx(1.1)
    rows = [dict(zip(*[line.split(",") for line in (lines[0], row)], strict=True)) for row in lines[1:]]
    assert sum(bool(row.get("epsilon")) for row in rows) >= 6  # log_every_n_steps=1: every step, and the epoch end


def test_resuming_from_a_lightning_checkpoint_continues_the_accountant(tmp_path: Path) -> None:
    train, _ = _loaders(shuffle=False, n=320)
    steps_per_epoch = len(train)

    def trainer(dp: PerExampleDP, epochs: int) -> L.Trainer:
        return L.Trainer(max_epochs=epochs, callbacks=[dp], logger=False, enable_checkpointing=False, **_QUIET)

    straight = PerExampleDP(seed=0)
    trainer(straight, 2).fit(DigitsNet(), train)
    first = PerExampleDP(seed=0)
    cut = trainer(first, 1)
    cut.fit(DigitsNet(), train)
    cut.save_checkpoint(tmp_path / "epoch1.ckpt")
    assert torch.load(tmp_path / "epoch1.ckpt", weights_only=True)["callbacks"][first.state_key] == first.state_dict()
    resumed = PerExampleDP(seed=0)
    trainer(resumed, 2).fit(DigitsNet(), train, ckpt_path=tmp_path / "epoch1.ckpt")
    assert sum(n for _, _, n in resumed.privacy_accountant.history) == 2 * steps_per_epoch
    assert resumed.epsilon() == pytest.approx(straight.epsilon())


def test_per_example_dp_defaults_to_standard_dp_sgd() -> None:
    dp = PerExampleDP()
    assert (dp.noise_multiplier, dp.max_grad_norm, dp.clipping, dp.noise_scaling) == (1.0, 1.0, "flat", "per_batch")


class _WithBatchNorm(DigitsNet):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (_WithBatchNorm, r"BatchNorm features\.1 \(BatchNorm2d\): .*ModuleValidator\.fix\(model\)"),
        (lambda: add_keylock(DigitsNet(), key_length=8), r"layer features\.0\.1 \(KeyLockNorm2d\) .*norm='group'"),
    ],
    ids=["batch_norm", "keylock_batch_norm"],
)
def test_batch_norm_is_refused_with_the_fix(make, match: str) -> None:
    train, _ = _loaders()
    with pytest.raises(ValueError, match=match):
        L.Trainer(max_steps=1, callbacks=[PerExampleDP()], logger=False, **_QUIET).fit(make(), train)


def test_the_module_validator_fix_named_in_the_error_makes_batch_norm_models_train() -> None:
    train, _ = _loaders()
    model = ModuleValidator.fix(_WithBatchNorm())
    L.Trainer(max_steps=2, callbacks=[PerExampleDP()], logger=False, enable_checkpointing=False, **_QUIET).fit(
        model, train
    )


def _clipped_mean_gradient(model: DigitsNet, x: Tensor, y: Tensor, clip: float) -> dict[str, Tensor]:
    """Brute force: one backward per example, flat clip to ``clip``, average (DP-SGD without noise)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    for j in range(len(y)):
        grads = torch.autograd.grad(F.cross_entropy(model(x[j : j + 1]), y[j : j + 1]), list(params.values()))
        scale = min(1.0, clip / torch.sqrt(sum(g.pow(2).sum() for g in grads)).item())
        for name, g in zip(params, grads, strict=True):
            total[name] += scale * g
    return {n: t / len(y) for n, t in total.items()}


@pytest.mark.parametrize("defence", ["passport", "keylock"])
def test_per_example_gradients_through_passport_and_keylock_layers_are_exact(defence: str) -> None:
    model = _defended(defence)
    reference = copy.deepcopy(model)
    train, _ = _loaders(batch_size=8, shuffle=False)
    released: list[dict[str, Tensor]] = []
    dp = PerExampleDP(noise_multiplier=0.0, max_grad_norm=0.05, sampling="shuffled_batches")
    dp.release = lambda module, grads, batch, opt: released.append({k: g.clone() for k, g in grads.items()})
    L.Trainer(max_steps=1, callbacks=[dp], logger=False, enable_checkpointing=False, **_QUIET).fit(model, train)
    x, y = next(iter(train))
    expected = _clipped_mean_gradient(reference, x, y, clip=0.05)
    unit_params = [k for k in expected if k.startswith("features.0")]
    assert unit_params and set(released[0]) == set(expected)
    for name, value in expected.items():
        assert torch.allclose(released[0][name], value, atol=1e-6), name


@pytest.mark.parametrize("defence", ["none", "passport", "keylock"])
def test_dp_sgd_with_model_defences_learns_digits_and_keeps_the_secrets(defence: str) -> None:
    model = _defended(defence)
    secrets = {k: v.clone() for k, v in private_state(model).items() if "passport" in k or k.endswith(".key")}
    train, test = _loaders()
    dp = PerExampleDP(noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
    trainer = L.Trainer(max_epochs=2, callbacks=[dp], logger=False, enable_checkpointing=False, **_QUIET)
    trainer.fit(model, train)
    assert 1.0 < trainer.callback_metrics["epsilon"].item() < 5.0
    accuracy = trainer.test(model, test, verbose=False)[0]["test_acc"]
    assert accuracy > 0.5  # chance is 0.1; measured 0.75 (none), 0.67 (passport), 0.76 (key-lock), docs/privacy.md
    assert secrets.keys() == {k for k in private_state(model) if "passport" in k or k.endswith(".key")}
    assert all(torch.equal(private_state(model)[k], v) for k, v in secrets.items())
    assert not any(m._forward_hooks or m._backward_hooks for m in model.modules())
