"""The bench on a user's own LightningDataModule, given in YAML as ``fit`` takes it, through the command and
``run_bench``: the same selection (``--defences``/``--attacks`` on the command line, ``only:`` in Python) gives the
same table. And a user's own LightningModule over a preset (``base:``): none of the preset model's options, and a
preset option it does not take named where the preset sets it."""

from __future__ import annotations

import csv

import pytest
import torch
import yaml

from lightning_fl.bench import load_settings, run_bench
from lightning_fl.bench.command import check_grid
from lightning_fl.bench.grid import Cell
from lightning_fl.cli import main
from tests.bench.test_bench import MINI

_USER_DATA = {"class_path": "tests.user_project.DigitsDataModule", "init_args": {"batch_size": 64}}
USER_GRID = {  # 8x8 digits from the user's DataModule; a 2-by-2-by-2 grid of which one cell is selected
    **MINI,
    "data": {"dataset": _USER_DATA, "num_clients": 4, "partition": "iid", "batch_size": 16},
    "attacks": {**MINI["attacks"], "dlg": {"class_path": "lightning_fl.attacks.DLGAttack"}},
    "threat_models": {**MINI["threat_models"]},
}
USER_GRID["attacks"]["ig"] = {**MINI["attacks"]["ig"], "init_args": {"max_iterations": 60}}
USER_GRID["loop"] = {**MINI["loop"], "num_rounds": 1, "local_steps": 2}
SELECTION = {"defences": ["none"], "attacks": ["ig"], "threat_models": ["fedsgd_b1"], "seeds": [0]}


def _table(folder) -> list[dict[str, str]]:
    """``bench.csv`` without its timing column (CPU seconds differ from run to run)."""
    return [{k: v for k, v in row.items() if "cpu" not in k} for row in csv.DictReader((folder / "bench.csv").open())]


def test_bench_runs_a_user_datamodule_from_yaml_with_a_selection_and_run_bench_gives_the_same_table(tmp_path):
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump({**USER_GRID, "output_dir": str(tmp_path / "unused")}))
    flags = [f"--{axis}={','.join(map(str, names))}" for axis, names in SELECTION.items()]
    assert main(["bench", "-c", str(config), *flags, "--output_dir", str(tmp_path / "command")]) == 0
    assert [p.name for p in (tmp_path / "command" / "cells").glob("*.json")] == ["none__ig__fedsgd_b1__s0.json"]
    (row,) = _table(tmp_path / "command")
    assert (row["defence"], row["attack"], row["threat_model"], row["status"]) == ("none", "ig", "fedsgd_b1", "ok")
    assert float(row["psnr_mean"]) > 20.0  # Inverting Gradients recovers one 8x8 digit of the user's data
    assert not (tmp_path / "command" / ".lightning-fl.lock").exists()  # the bench's lock is released
    assert "Seeds per cell: 1. " in (tmp_path / "command" / "bench.md").read_text()  # a count ("[1]" read as seed 1)

    # the same settings in Python, the DataModule as a class path alone, the selection as only:
    settings = {**USER_GRID, "data": {**USER_GRID["data"], "dataset": _USER_DATA["class_path"]}, "only": SELECTION}
    run_bench(settings, tmp_path / "python", print_=lambda _: None)
    assert _table(tmp_path / "python") == _table(tmp_path / "command")


def test_a_dataset_class_path_that_does_not_import_names_the_key(tmp_path) -> None:
    from lightning_fl.bench import build_loop

    spec = {"seed": 0, "data": {"dataset": "tests.user_project.NoSuchData"}, "model": MINI["model"], "loop": {}}
    with pytest.raises(ValueError, match=r"^data.dataset \(class_path 'tests.user_project.NoSuchData'\): "):
        build_loop(spec, tmp_path)


@pytest.mark.parametrize("dataset", [_USER_DATA, _USER_DATA["class_path"]])
def test_the_attackers_public_data_is_the_user_datamodules_test_split(dataset) -> None:
    """A prior-only guess (``PriorBaseline``) on a bench over a user's DataModule gets that DataModule's own test
    split, read through its ``setup``/``test_dataloader`` hooks (not a data set named by the bench)."""
    from lightning_fl.bench.cell import build_attack, public_data
    from tests.user_project import DigitsDataModule

    spec = {"seed": 0, "data": {**USER_GRID["data"], "dataset": dataset}}
    public = public_data(spec)
    user = DigitsDataModule()
    user.setup("test")
    expected = user.test_dataloader().dataset
    assert len(public) == len(expected) == 297
    assert all(torch.equal(public[i][0], expected[i][0]) and int(public[i][1]) == int(expected[i][1]) for i in (0, 296))

    prior = {"class_path": "lightning_fl.attacks.PriorBaseline", "init_args": {"guess": "mean"}}
    attack = build_attack({**spec, "attack": prior}, "prior_mean", 0)
    assert tuple(attack.images.shape) == (297, 1, 8, 8)
    assert torch.allclose(attack.images.mean(0), torch.stack([x for x, _ in expected]).mean(0))


def test_the_public_data_is_read_once_per_data_setting_for_every_guess_and_cell(monkeypatch) -> None:
    """Each prior-only guess of each cell read the test split again (a new DataModule, set up, its test set loaded);
    now cells whose data differ only in how the training split is partitioned and batched share one read."""
    from lightning_fl.bench.cell import build_attack
    from tests.user_project import DigitsDataModule

    made = []
    original = DigitsDataModule.__init__
    monkeypatch.setattr(DigitsDataModule, "__init__", lambda self, **kw: made.append(1) or original(self, **kw))
    user = {**_USER_DATA, "init_args": {"batch_size": 63}}  # a setting no other test reads
    guesses = {"prior_mean": "mean", "prior_class": "class_sample"}
    attacks = [
        build_attack(
            {
                "seed": seed,
                "data": {**USER_GRID["data"], "dataset": user, "batch_size": batch, "num_clients": clients},
                "attack": {"class_path": "lightning_fl.attacks.PriorBaseline", "init_args": {"guess": guess}},
            },
            name,
            seed,
        )
        for name, guess in guesses.items()
        for seed, batch, clients in [(0, 1, 4), (1, 4, 11)]
    ]
    assert len(made) == 1
    assert all(torch.equal(a.images, attacks[0].images) for a in attacks) and len(attacks[0].images) == 297

    other = {"seed": 0, "data": {**USER_GRID["data"], "dataset": {**user, "init_args": {"batch_size": 62}}}}
    build_attack({**other, "attack": {"class_path": "lightning_fl.attacks.PriorBaseline"}}, "prior_class", 0)
    assert len(made) == 2  # another data setting: read again


def test_a_user_datamodule_without_a_test_split_names_the_guess_that_needs_one() -> None:
    """Before, the guess failed with the global evaluation's advice (``set loop.eval_every=0``), which a bench whose
    utility runs evaluate nothing has already followed."""
    import lightning as L

    from lightning_fl.bench.cell import build_attack
    from tests.user_project import DigitsDataModule

    class TrainOnly(DigitsDataModule):
        test_dataloader = L.LightningDataModule.test_dataloader  # the user wrote no test or validation loader

    spec = {"seed": 0, "data": {**USER_GRID["data"], "dataset": TrainOnly()}}
    spec["attack"] = {"class_path": "lightning_fl.attacks.PriorBaseline", "init_args": {"guess": "mean"}}
    with pytest.raises(ValueError, match=r"^attacks.prior_mean takes public_data, the test split of data.dataset "):
        build_attack(spec, "prior_mean", 0)


def test_a_users_model_over_a_preset_takes_none_of_its_options_and_a_preset_key_it_lacks_is_named(
    tmp_path, capsys
) -> None:
    (tmp_path / "preset.yaml").write_text(yaml.safe_dump({**MINI, "output_dir": str(tmp_path / "unused")}))
    mine = tmp_path / "mine.yaml"
    model = {"class_path": "tests.user_project.DigitsNet"}
    written = {"base": "preset.yaml", "model": model, "data": {"image_size": 8}, "output_dir": str(tmp_path / "out")}
    mine.write_text(yaml.safe_dump(written))
    assert load_settings(mine)["model"] == model  # not the preset's backbone/optimizer/lr
    assert main(["bench", "-c", str(mine)]) == 2  # the preset's attack run sets optimizer: sgd
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "model.init_args.optimizer is not an option of tests.user_project.DigitsNet" in line
    assert line.endswith("set by attack_run.model; give that model its own class_path there to replace it.")

    attack_model = {**model, "init_args": {"lr": 0.1}}  # the fix the line names
    mine.write_text(yaml.safe_dump({**written, "attack_run": {"model": attack_model}}))
    settings = load_settings(mine)
    assert Cell("none", "ig", "fedsgd_b1", 0).spec(settings)["model"] == attack_model
    check_grid(settings)  # every run builds

    mine.write_text(yaml.safe_dump({**written, "attack_run": {"model": attack_model}, "loop": {"eval_metric": "acc"}}))
    assert main(["bench", "-c", str(mine)]) == 2  # found on one test batch, before the first run trains
    assert "loop.eval_metric='acc' was not logged by DigitsNet.test_step" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
