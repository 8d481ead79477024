from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_fl.defences.model.split import PrivateFineTuning, PrivateSplit, split_private
from lightning_fl.models import LeNetDLG, resnet20
from lightning_fl.private import private_state, public_state
from tests.defences.leakage import defended_model, digits


@pytest.mark.parametrize(
    ("cut", "expected"),
    [
        (1, {"body.0.weight", "body.0.bias"}),
        (2, {"body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias"}),
        ("body.1", {"body.0.weight", "body.0.bias"}),
        ("body.2", {"body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias"}),
    ],
)
def test_split_private_marks_the_layers_before_the_cut(cut: int | str, expected: set[str]) -> None:
    assert set(private_state(split_private(LeNetDLG(), cut=cut))) == expected


def test_split_private_keeps_the_batch_norm_of_the_first_block_private() -> None:
    net = split_private(resnet20(), cut=1)
    assert set(private_state(net)) == {
        "conv1.weight",
        "bn1.weight",
        "bn1.bias",
        "bn1.running_mean",
        "bn1.running_var",
        "bn1.num_batches_tracked",
    }
    assert "layers.0.conv1.weight" in public_state(net)


def test_split_private_cut_after_the_last_conv_keeps_the_head_public() -> None:
    net = split_private(LeNetDLG(), cut=3)
    assert set(public_state(net)) == {"fc.weight", "fc.bias"}


@pytest.mark.parametrize(
    ("cut", "match"),
    [(0, r"cut=0\) must be between 1 and the model's 3 convolutions"), ("body.9", r"cut='body.9'\) is not a module")],
)
def test_split_private_rejects_bad_cuts(cut: int | str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        split_private(LeNetDLG(), cut=cut)


def test_private_split_defence_is_split_private() -> None:
    assert set(private_state(PrivateSplit(cut=1).apply_to_model(LeNetDLG()))) == {"body.0.weight", "body.0.bias"}


def test_private_fine_tuning_trains_private_layers_only() -> None:
    dm = digits()
    model = defended_model(dm, "passports")
    before_public = {k: v.clone() for k, v in public_state(model).items()}
    before_private = {k: v.clone() for k, v in private_state(model).items()}

    class StopAtStart(L.Callback):
        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            trainer.should_stop = True

    trainer = L.Trainer(
        max_steps=1,
        callbacks=[PrivateFineTuning(steps=3), StopAtStart()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=dm.train_dataloader(0))
    fine_tuned = private_state(model)
    assert any(not torch.equal(fine_tuned[k], before_private[k]) for k in before_private if "weight" in k)
    assert torch.equal(fine_tuned["backbone.body.0.passport_gamma"], before_private["backbone.body.0.passport_gamma"])
    public = public_state(model)
    assert all(torch.equal(public[k], before_public[k]) for k in before_public)


class _FirstBatch(L.Callback):
    """Keeps the first training batch of the local pass and stops there."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self.batch = [t.clone() for t in batch]
        trainer.should_stop = True


@pytest.mark.parametrize("own_generator", [True, False])
def test_private_fine_tuning_leaves_the_local_pass_its_batches(own_generator: bool) -> None:
    """The fine-tuning's draws do not move the shuffle of the local pass that follows it, so a passports client is
    trained, and attacked, on the batches of an undefended one (a loader with its own generator, or the global one)."""
    dm = digits()
    first = {}
    for steps in (0, 10):
        torch.manual_seed(3)
        loader = dm.train_dataloader(0)
        if not own_generator:
            loader = torch.utils.data.DataLoader(loader.dataset, batch_size=loader.batch_size, shuffle=True)
        seen = _FirstBatch()
        trainer = L.Trainer(
            max_steps=1,
            callbacks=[PrivateFineTuning(steps=steps), seen],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(defended_model(dm, "passports"), train_dataloaders=loader)
        first[steps] = seen.batch
    assert all(torch.equal(a, b) for a, b in zip(first[0], first[10], strict=True))


@pytest.mark.parametrize(("kwargs", "match"), [({"steps": -1}, r"steps=-1\) must be >= 0"), ({"lr": 0}, r"lr=0\)")])
def test_private_fine_tuning_rejects_bad_options(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PrivateFineTuning(**kwargs)
