"""A user's own data (a LightningDataModule, a TensorDataset, a Dataset of pairs) federated with a user's model."""

from __future__ import annotations

import json

import lightning as L
import numpy as np
import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

from lightning_fl import FederatedLoop
from lightning_fl.cli import main
from lightning_fl.datamodules import FederatedDataModule, dataset_labels
from tests.user_project import DigitsDataModule, DigitsNet, DigitsPairs, digits_tensors


def _fit(dm: FederatedDataModule, tmp_path, *, eval_every: int = 1) -> FederatedLoop:
    torch.manual_seed(0)
    loop = FederatedLoop(
        DigitsNet(),
        dm,
        num_rounds=2,
        local_epochs=2,
        eval_every=eval_every,
        output_dir=tmp_path,
        checkpoint=False,
        progress_bar=False,
    )
    loop.fit()
    return loop


def test_user_datamodule_is_split_and_its_test_set_evaluates_the_global_model(tmp_path) -> None:
    dm = FederatedDataModule(DigitsDataModule(), num_clients=4, partition="iid", batch_size=32)
    assert sum(dm.num_train_samples(k) for k in range(4)) + sum(len(dm.client_val_set(k)) for k in range(4)) == 1500
    assert len(dm.test_set) == 297 and dm.input_shape == (1, 8, 8) and dm.num_classes == 10
    loop = _fit(dm, tmp_path)
    assert all(h["train_loss"] is not None for h in loop.history)
    assert loop.history[-1]["test_accuracy"] > 0.6  # chance is 0.1; measured 0.78


@pytest.mark.parametrize("make", [lambda x, y: TensorDataset(x, y), DigitsPairs], ids=["tensor_dataset", "pairs"])
def test_user_dataset_trains_a_user_model(make, tmp_path) -> None:
    x, y = digits_tensors()
    dm = FederatedDataModule(
        make(x[:1500], y[:1500]), test_dataset=make(x[1500:], y[1500:]), num_clients=3, partition="dirichlet"
    )
    loop = _fit(dm, tmp_path)
    assert loop.history[-1]["test_accuracy"] > 0.6  # measured 0.74


def test_labels_are_read_without_loading_samples_when_the_dataset_stores_them() -> None:
    class Stored(TensorDataset):
        def __getitem__(self, index):  # a sample read would fail: only .targets may be used
            raise AssertionError("labels were read sample by sample")

    x, y = digits_tensors()
    stored = Stored(x)
    stored.targets = y.tolist()
    assert np.array_equal(dataset_labels(stored), y.numpy())
    assert np.array_equal(dataset_labels(DigitsPairs(x, y)), y.numpy())


def test_dataset_without_test_set_trains_and_says_how_to_evaluate(tmp_path) -> None:
    x, y = digits_tensors()
    dm = FederatedDataModule(TensorDataset(x, y), num_clients=2, partition="iid")
    _fit(dm, tmp_path, eval_every=0)
    with pytest.raises(ValueError, match=r"no test set .* pass data\.test_dataset=.*loop\.eval_every=0"):
        dm.test_dataloader()


def test_datamodule_without_train_set_names_the_fix() -> None:
    class NoTrain(L.LightningDataModule):
        def test_dataloader(self) -> DataLoader:
            return DataLoader(TensorDataset(*digits_tensors()))

    with pytest.raises(ValueError, match=r"data\.dataset=NoTrain has no training set.*train_dataloader\(\)"):
        FederatedDataModule(NoTrain(), num_clients=2).setup()


@pytest.mark.parametrize(
    ("dataset", "error", "match"),
    [
        (42, TypeError, "data.dataset is a int; pass a dataset name"),
        (TensorDataset(torch.rand(4, 2), torch.rand(4)), ValueError, "one integer class label per sample"),
        (TensorDataset(torch.rand(4, 2)), ValueError, r"not an \(x, y\) pair"),
    ],
)
def test_unusable_data_gets_a_one_line_error(dataset, error, match) -> None:
    with pytest.raises(error, match=match):
        FederatedDataModule(dataset, num_clients=2, partition="iid").setup()


def test_model_options_refuses_non_image_samples() -> None:
    x, y = digits_tensors(images=False)
    dm = FederatedDataModule(TensorDataset(x, y), num_clients=2, partition="iid")
    with pytest.raises(ValueError, match=r"shape \(64,\), not images"):
        _ = dm.model_options


def test_model_options_of_a_user_image_dataset_match_the_stored_statistics() -> None:
    x, y = digits_tensors()
    options = FederatedDataModule(DigitsPairs(x, y), num_clients=2, partition="iid").model_options
    assert options["in_channels"] == 1 and options["image_size"] == 8 and options["num_classes"] == 10
    assert options["input_mean"][0] == pytest.approx(x.mean().item(), abs=1e-5)
    assert options["input_std"][0] == pytest.approx(x.std().item(), abs=1e-5)


def test_test_dataset_is_refused_where_the_source_brings_its_own() -> None:
    with pytest.raises(ValueError, match=r"data\.test_dataset is only used with a Dataset"):
        FederatedDataModule("digits", test_dataset=TensorDataset(*digits_tensors()))


def test_cli_fits_a_user_datamodule_and_a_user_model_from_yaml(tmp_path) -> None:
    config = tmp_path / "user.yaml"
    config.write_text(
        "data:\n  dataset:\n    class_path: tests.user_project.DigitsDataModule\n  num_clients: 4\n  partition: iid\n"
        "model:\n  class_path: tests.user_project.DigitsNet\n"
        "loop:\n  num_rounds: 2\n  local_epochs: 2\n  progress_bar: false\n  checkpoint: false\n"
    )
    assert main(["fit", "--config", str(config), "--output_dir", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.5  # the user's own test set (297 digits), chance 0.1


def _photo_patches(count: int, seed: int) -> TensorDataset:
    """``count`` random 16x16 RGB patches of each of sklearn's two photos (china, flower), labelled by photo."""
    from sklearn.datasets import load_sample_images

    g = torch.Generator().manual_seed(seed)
    patches, labels = [], []
    for label, photo in enumerate(load_sample_images().images):
        image = torch.tensor(photo).permute(2, 0, 1).float() / 255.0
        for _ in range(count):
            top = int(torch.randint(0, image.shape[1] - 16, (1,), generator=g))
            left = int(torch.randint(0, image.shape[2] - 16, (1,), generator=g))
            patches.append(image[:, top : top + 16, left : left + 16])
            labels.append(label)
    return TensorDataset(torch.stack(patches), torch.tensor(labels))


def test_natural_rgb_photos_in_a_user_dataset_train_our_classifier_from_model_options(tmp_path) -> None:
    from lightning_fl.models import ImageClassifier

    dm = FederatedDataModule(
        _photo_patches(150, seed=0), test_dataset=_photo_patches(50, seed=1), num_clients=2, partition="iid"
    )
    options = dm.model_options
    assert (options["num_classes"], options["in_channels"], options["image_size"]) == (2, 3, 16)
    torch.manual_seed(0)
    model = ImageClassifier("lenet5", **options, lr=2e-3)
    loop = FederatedLoop(
        model, dm, num_rounds=2, local_epochs=2, output_dir=tmp_path, checkpoint=False, progress_bar=False
    )
    assert loop.fit()["test_accuracy"] > 0.8  # chance 0.5


def test_a_user_datamodule_keeps_its_own_batch_size_unless_data_batch_size_is_set() -> None:
    own = FederatedDataModule(DigitsDataModule(batch_size=8), num_clients=2, partition="iid")
    assert own.batch_size == 8 and own.train_dataloader(0).batch_size == 8
    chosen = FederatedDataModule(DigitsDataModule(batch_size=8), num_clients=2, partition="iid", batch_size=16)
    assert chosen.train_dataloader(0).batch_size == 16
    assert FederatedDataModule("digits", num_clients=2, partition="iid").batch_size == 32


@pytest.mark.parametrize("options", [{"image_size": 16}, {"channels": 3}, {"root": "."}])
def test_image_options_are_refused_for_a_source_used_as_it_is(options) -> None:
    (key,) = options
    match = rf"^data\.{key}=.* applies to dataset names and ImageFolder paths; data\.dataset is DigitsDataModule, "
    with pytest.raises(ValueError, match=match + rf"which is used as it is: drop data\.{key} or set it to null"):
        FederatedDataModule(DigitsDataModule(), **options)


_USER_DM = {"class_path": "tests.user_project.DigitsDataModule"}
_SMALL = {"num_clients": 2, "partition": "iid"}


@pytest.mark.parametrize(
    ("config", "args", "named"),
    [  # the default image size, given: it was ignored (a run trained on the 8x8 digits and exited 0)
        ({"data": {"dataset": _USER_DM, "image_size": 32, **_SMALL}}, [], "data.image_size=32"),
        ({"data": {"dataset": _USER_DM, **_SMALL}}, ["--data.image_size", "32"], "data.image_size=32"),
        ({"data": {"dataset": _USER_DM, **_SMALL}}, ["--data.root", "."], "data.root='.'"),
        (
            {"data": {"dataset": "digits", "image_size": 32, **_SMALL}},
            ["--data.dataset", json.dumps(_USER_DM)],
            "data.image_size=32",
        ),
    ],
    ids=["yaml", "command line", "root", "dataset on the command line"],
)
def test_a_name_only_data_key_given_with_a_user_datamodule_exits_2_before_writing(
    tmp_path, capsys, config, args, named
) -> None:
    path = tmp_path / "fit.yaml"
    path.write_text(yaml.safe_dump({**config, "model": {"class_path": "tests.user_project.DigitsNet"}}))
    assert main(["fit", "-c", str(path), *args, "--output_dir", str(tmp_path / "run")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    fix = "which is used as it is: drop data."
    assert f"{named} applies to dataset names and ImageFolder paths" in line and fix in line
    assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("cwd_with_finished_runs")
def test_a_bench_over_a_user_datamodule_under_a_preset_image_size_exits_2_before_writing(tmp_path, capsys) -> None:
    from tests.bench.test_bench_user_data import USER_GRID

    grid = {**USER_GRID, "data": {**USER_GRID["data"], "image_size": 32}, "output_dir": str(tmp_path / "out")}
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(grid))
    assert main(["bench", "-c", str(tmp_path / "bench.yaml")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "data.image_size=32 applies to dataset names and ImageFolder paths" in line, line
    assert not (tmp_path / "out").exists()


def test_the_saved_config_of_a_user_datamodule_records_no_unused_image_options(tmp_path) -> None:
    source = "{class_path: tests.user_project.DigitsDataModule, init_args: {batch_size: 8}}"
    args = ["--data.dataset", source, "--data.num_clients", "2", "--data.partition", "iid"]
    args += ["--model", "tests.user_project.DigitsNet", "--loop.num_rounds", "1", "--loop.progress_bar", "false"]
    assert main(["fit", *args, "--output_dir", str(tmp_path / "run")]) == 0
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "image_size" not in saved and "batch_size: 8" in saved and "batch_size: 32" not in saved


WRAP_IT = r"datamodule is a LightningDataModule \(one data set, not clients\); wrap it: FederatedDataModule\(Digits"


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (DigitsDataModule(), WRAP_IT),
        (DigitsPairs(*digits_tensors()), r"datamodule is a DigitsPairs .*wrap it: FederatedDataModule\(DigitsPairs"),
        ("digits", r"datamodule is a str; pass a FederatedDataModule"),
    ],
    ids=["LightningDataModule", "Dataset", "name"],
)
def test_data_that_is_not_federated_is_refused_with_the_wrapper_to_use(data, match: str) -> None:
    from lightning_fl.validation import check_federated_data

    with pytest.raises(TypeError, match=match):
        check_federated_data(data)
    check_federated_data(FederatedDataModule(DigitsDataModule(), num_clients=2, partition="iid"))  # wrapped: taken


def test_the_loop_refuses_a_plain_lightning_datamodule_naming_the_wrapper(tmp_path) -> None:
    class SetupWithoutStage(DigitsDataModule):  # as the user wrote it: setup(stage=None)
        def setup(self, stage: str | None = None) -> None:
            super().setup(stage or "fit")

    with pytest.raises(TypeError, match=r"wrap it: FederatedDataModule\(SetupWithoutStage\(\.\.\.\)"):
        FederatedLoop(DigitsNet(), SetupWithoutStage(), output_dir=tmp_path / "run")
