"""Any LightningModule is a client model: a user's own module runs in the loop and from the CLI, with defences."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from torch import nn

from lightning_fl import FederatedLoop
from lightning_fl.cli import main
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import KeyLocks
from lightning_fl.federation import split_batch
from lightning_fl.private import private_state
from tests.federation.user_model import UserNet


def _digits() -> FederatedDataModule:
    return FederatedDataModule("digits", num_clients=3, partition="iid", image_size=16, batch_size=32, seed=0)


def test_user_module_that_logs_its_own_loss_trains_in_the_loop(tmp_path: Path) -> None:
    torch.manual_seed(0)
    loop = FederatedLoop(
        UserNet(),
        _digits(),
        num_rounds=3,
        clients_per_round=3,
        train_loss_key="loss",
        eval_metric="acc",
        output_dir=tmp_path,
        progress_bar=False,
    )
    history = loop.fit()["history"]
    assert history[0]["train_loss"] > history[-1]["train_loss"] > 0
    assert history[-1]["test_accuracy"] > 0.6


def test_defences_retrofit_a_user_module_and_its_secrets_stay_on_the_clients(tmp_path: Path) -> None:
    torch.manual_seed(0)
    loop = FederatedLoop(
        UserNet(),
        _digits(),
        num_rounds=1,
        defences=[KeyLocks(key_length=16)],
        output_dir=tmp_path,
        progress_bar=False,
        train_loss_key="loss",
        eval_metric="acc",
        eval_on="clients",
    )
    private = set(private_state(loop.global_model))
    assert private and not private & set(loop.spec.update_keys)
    loop.fit()
    server = torch.load(loop.checkpoint.server_path, weights_only=True)
    assert not private & set(server["global_state"])


class _NoStep(L.LightningModule):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (nn.Linear(2, 2), "wrap your torch module in a lightning.LightningModule"),
        (_NoStep(), "_NoStep does not define training_step"),
    ],
)
def test_loop_rejects_a_model_that_cannot_train_and_says_what_to_add(model, match: str, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=match):
        FederatedLoop(model, _digits(), output_dir=tmp_path)


class _DictBatches(UserNet):
    def fl_split_batch(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return batch["image"], batch["label"]


def test_split_batch_reads_tuples_and_the_documented_hook_for_other_structures() -> None:
    x, y = torch.zeros(2, 1, 16, 16), torch.tensor([1, 2])
    assert split_batch(UserNet(), (x, y))[1] is y
    assert split_batch(_DictBatches(), {"image": x, "label": y})[0] is x
    with pytest.raises(TypeError, match="Define fl_split_batch"):
        split_batch(UserNet(), {"image": x, "label": y})


_KEYLOCK = {"class_path": "lightning_fl.defences.KeyLocks", "init_args": {"key_length": 16}}
_PASSPORTS = {"class_path": "lightning_fl.defences.Passports", "init_args": {"passport_size": 16}}
_FED_CDP = {"class_path": "lightning_fl.defences.FedCDP", "init_args": {"noise_multiplier": 1.0}}


_KEYLOCK_PER_EXAMPLE = {
    "class_path": "lightning_fl.defences.KeyLocks",
    "init_args": {"key_length": 16, "norm": "group"},
}


@pytest.mark.parametrize(
    "defences",
    [[_KEYLOCK], [_PASSPORTS], [_FED_CDP], [_KEYLOCK_PER_EXAMPLE, _PASSPORTS, _FED_CDP]],
    ids=["keylock", "passports", "fed_cdp", "all_three"],
)
def test_cli_fits_a_user_class_path_model_with_a_top_level_defences_list(defences: list, tmp_path: Path) -> None:
    config = {
        "data": {"dataset": "digits", "num_clients": 2, "partition": "iid", "image_size": 16, "batch_size": 32},
        "model": {"class_path": "tests.federation.user_model.UserNet", "init_args": {"lr": 0.1}},
        "defences": defences,
        "loop": {
            "num_rounds": 1,
            "clients_per_round": 2,
            "local_steps": 2,
            "train_loss_key": "loss",
            "eval_metric": "acc",
            "progress_bar": False,
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["fit", "--config", str(path), "--output_dir", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds_completed"] == 1 and summary["history"][0]["train_loss"] is not None
    assert ("epsilon" in summary["history"][0]) == (_FED_CDP in defences)


class _ValidationOnlyNet(L.LightningModule):
    """A user's model that scores itself in ``validation_step`` only (no ``test_step``), as many projects do."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = nn.functional.cross_entropy(self.net(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        self.log("val_acc", (self.net(batch[0]).argmax(1) == batch[1]).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


def test_a_model_without_test_step_is_scored_by_its_validation_step(tmp_path: Path) -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=8, seed=0)
    torch.manual_seed(0)
    loop = FederatedLoop(
        _ValidationOnlyNet(), dm, num_rounds=2, eval_metric="val_acc", output_dir=tmp_path, progress_bar=False
    )
    assert loop.fit()["test_accuracy"] > 0.5  # chance 0.1
