"""Plain clients train on Lightning Fabric and get the Trainer's result to the bit; the others keep the Trainer."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from lightning_fl import FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import FedCDP, KeyLocks
from lightning_fl.federation.evaluation import Evaluator
from lightning_fl.federation.fabric_fit import lean_test, model_needs_trainer
from lightning_fl.private import public_state
from lightning_fl.trainers import build_trainer, quiet_lightning, trainer_options
from tests.conftest import make_classifier
from tests.federation.user_model import UserNet


class _DropoutNet(UserNet):
    """A user's module with dropout (global RNG inside the step), a dict output and per-step ``log_dict``."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.features(x).flatten(1)))

    def training_step(self, batch, batch_idx: int) -> dict:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log_dict({"loss": loss, "lr": 0.1})
        return {"loss": loss}


class _MetricLogger(UserNet):
    """Logs a torchmetrics ``Metric`` object in ``training_step``: only the Trainer reduces that."""

    def __init__(self) -> None:
        super().__init__()
        self.train_acc = MulticlassAccuracy(num_classes=10)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        self.train_acc(logits, y)
        self.log("acc", self.train_acc)
        return super().training_step(batch, batch_idx)


class _BatchHook(UserNet):
    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        """A hook only the Trainer calls."""


class _EpochReader(UserNet):
    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        """Warms up on its first epoch: reads a counter only the Trainer fills in (Fabric would leave it 0)."""
        loss = super().training_step(batch, batch_idx)
        return loss * 0.1 if self.current_epoch == 0 else loss


class _Scheduled(UserNet):
    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1)}


def _run(tmp_path: Path, model_fn, inner_fit: str, **options) -> tuple[FederatedLoop, list, list]:
    dm = FederatedDataModule("digits", num_clients=4, partition="dirichlet", alpha=0.5, image_size=16, batch_size=24)
    torch.manual_seed(0)
    model = model_fn(dm)
    loss_key = "train_loss" if isinstance(model, type(make_classifier(dm))) else "loss"
    loop = FederatedLoop(
        model,
        dm,
        num_rounds=2,
        clients_per_round=2,
        train_loss_key=loss_key,
        eval_metric="test_acc" if loss_key == "train_loss" else "acc",
        output_dir=tmp_path / inner_fit,
        checkpoint=False,
        progress_bar=False,
        **options,
    )
    loop.runner.inner_fit = inner_fit
    updates, paths, fit = [], [], loop.runner.fit

    def recording_fit(ctx, received, *, callbacks=()):
        paths.append(loop.runner.inner_fit_for(callbacks))
        result = fit(ctx, received, callbacks=callbacks)
        updates.append(result.update)
        return result

    loop.runner.fit = recording_fit
    loop.fit()
    return loop, updates, paths


@pytest.mark.parametrize(
    ("model_fn", "options"),
    [
        (make_classifier, {"local_epochs": 2}),
        (make_classifier, {"local_steps": 5, "defences": [KeyLocks(key_length=16)]}),  # steps cross an epoch end
        (lambda dm: UserNet(), {"local_epochs": 2}),  # logs on epoch in training_step: a weighted mean
        (lambda dm: _DropoutNet(), {"local_steps": 4}),
    ],
    ids=["lenet-epochs", "lenet-keylocks-steps", "user-epoch-mean", "user-dropout-log-dict"],
)
def test_plain_clients_train_on_fabric_to_the_bit_of_the_trainer(tmp_path: Path, model_fn, options) -> None:
    trainer, trainer_updates, _ = _run(tmp_path, model_fn, "trainer", **options)
    fabric, fabric_updates, paths = _run(tmp_path, model_fn, "auto", **options)
    assert {p for p, _ in paths} == {"fabric"}
    assert fabric.history == trainer.history  # losses and accuracies, exactly
    for ours, theirs in zip(fabric_updates, trainer_updates, strict=True):
        assert (ours.client_id, ours.loss, ours.metadata) == (theirs.client_id, theirs.loss, theirs.metadata)
        assert all(torch.equal(ours.delta[k], theirs.delta[k]) for k in theirs.delta)
    for key, value in public_state(trainer.global_model).items():
        assert torch.equal(public_state(fabric.global_model)[key], value), key
    for ours, theirs in zip(fabric.clients, trainer.clients, strict=True):
        assert all(torch.equal(ours.private[k], theirs.private[k]) for k in theirs.private)


def test_a_module_that_logs_what_only_the_trainer_reduces_is_trained_again_on_the_trainer(tmp_path: Path) -> None:
    trainer, trainer_updates, _ = _run(tmp_path, lambda dm: _MetricLogger(), "trainer", local_steps=3)
    auto, auto_updates, paths = _run(tmp_path, lambda dm: _MetricLogger(), "auto", local_steps=3)
    assert paths[0] == ("fabric", None) and paths[1][0] == "trainer" and "logs" in paths[1][1]
    assert auto.history == trainer.history
    assert [u.loss for u in auto_updates] == [u.loss for u in trainer_updates]


@pytest.mark.parametrize(
    ("model_fn", "options", "reason"),
    [
        (lambda dm: _BatchHook(), {}, "overrides ['on_train_batch_start']"),
        (lambda dm: _Scheduled(), {}, "configure_optimizers returns dict"),
        (lambda dm: _EpochReader(), {}, "_EpochReader.training_step reads ['current_epoch']"),
        (make_classifier, {"trainer": {"gradient_clip_val": 1.0}}, "loop.trainer sets ['gradient_clip_val']"),
        (make_classifier, {"defences": [FedCDP(noise_multiplier=0.5)]}, "client callbacks ['PerExampleDP']"),
    ],
    ids=["trainer-hook", "scheduler", "reads-current-epoch", "trainer-option", "per-example-dp"],
)
def test_clients_that_need_the_trainer_keep_it_and_say_why(tmp_path: Path, model_fn, options, reason) -> None:
    _, updates, paths = _run(tmp_path, model_fn, "auto", local_steps=2, **options)
    assert updates and all(path == "trainer" and reason in why for path, why in paths)


def test_the_fabric_fit_leaves_no_fabric_or_logging_hooks_on_the_model(tmp_path: Path) -> None:
    loop, _, paths = _run(tmp_path, make_classifier, "auto", local_steps=2)
    worker = loop.runner.worker
    assert paths[0][0] == "fabric" and worker.fabric is None
    assert "log" not in vars(worker) and "log_dict" not in vars(worker)
    assert isinstance(worker, L.LightningModule)


@pytest.mark.parametrize("model_fn", [make_classifier, lambda dm: UserNet()], ids=["classifier", "user"])
def test_the_lean_test_gives_the_trainers_metrics_and_restores_the_training_mode(model_fn) -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16, batch_size=32, seed=0)
    dm.setup()
    torch.manual_seed(0)
    model = model_fn(dm)
    model.backbone.eval() if hasattr(model, "backbone") else model.head.eval()  # a mixed mode, to be restored
    modes = [m.training for m in model.modules()]
    evaluator = Evaluator(trainer_options(None), metric="test_acc" if hasattr(model, "backbone") else "acc")
    lean = evaluator.test(model, dm.test_dataloader())
    assert [m.training for m in model.modules()] == modes
    evaluator.lean = False
    assert lean == evaluator.test(model, dm.test_dataloader())
    assert lean_test(model, dm.test_dataloader()) == trainer_results(model, dm.test_dataloader())


def trainer_results(model: L.LightningModule, loader) -> dict[str, float]:
    with quiet_lightning():
        results = build_trainer(trainer_options(None)).test(model, dataloaders=loader, verbose=False)[0]
    return {k: float(v) for k, v in results.items()}


def test_a_batch_transfer_hook_keeps_the_trainer_for_fit_and_test() -> None:
    class Shifted(UserNet):
        def on_before_batch_transfer(self, batch, dataloader_idx: int):
            return batch[0] + 1, batch[1]

    assert "on_before_batch_transfer" in model_needs_trainer(Shifted(), stage="fit")
    assert "on_before_batch_transfer" in model_needs_trainer(Shifted(), stage="test")
    assert model_needs_trainer(UserNet(), stage="test") is None
