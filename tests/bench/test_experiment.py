"""The shared builder reads a hand-written ``lightning-fl fit`` config and trains exactly as the command does."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml

from lightning_fl.bench import fit_config_spec, fit_spec, scratch_loop
from lightning_fl.cli import main

FIT = {
    "seed_everything": 3,
    "output_dir": "runs/ignored",
    "data": {"dataset": "digits", "num_clients": 4, "partition": "dirichlet", "alpha": 0.5, "image_size": 16},
    "model": {
        "class_path": "lightning_fl.models.ImageClassifier",
        "init_args": {"backbone": "lenet_dlg", "optimizer": "adam", "lr": 0.002},
    },
    "loop": {"num_rounds": 2, "clients_per_round": 2, "local_steps": 3, "trainer": {"accelerator": "cpu"}},
}


def test_a_fit_config_read_as_a_spec_trains_the_same_history_as_lightning_fl_fit(tmp_path) -> None:
    config = tmp_path / "fit.yaml"
    config.write_text(yaml.safe_dump(FIT))
    built = fit_spec(fit_config_spec(config), tmp_path / "spec")
    assert main(["fit", "-c", str(config), "--output_dir", str(tmp_path / "fit")]) == 0
    fit = json.loads((tmp_path / "fit" / "summary.json").read_text())
    assert built["history"] == fit["history"] and fit["rounds_completed"] == 2


def test_overrides_replace_a_key_and_unknown_keys_are_named(tmp_path) -> None:
    config = tmp_path / "fit.yaml"
    config.write_text(yaml.safe_dump({**FIT, "lopo": {}}))
    with pytest.raises(ValueError, match=r"\['lopo'\] are not fit settings"):
        fit_config_spec(config)
    config.write_text(yaml.safe_dump(FIT))
    spec = fit_config_spec(config, seed=7, loop={"num_rounds": 1})
    assert spec["seed"] == 7 and spec["loop"] == {"num_rounds": 1} and "output_dir" not in spec
    with pytest.raises(ValueError, match="no such fit config"):
        fit_config_spec(tmp_path / "missing.yaml")


def test_a_scratch_loop_trains_as_fit_spec_and_leaves_no_directory_nor_warning(tmp_path) -> None:
    config = tmp_path / "fit.yaml"
    config.write_text(yaml.safe_dump(FIT))
    spec = fit_config_spec(config)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with scratch_loop(spec) as loop:
            history = loop.fit()["history"]
            warnings.warn("a warning of the run", UserWarning, stacklevel=1)
            recorded = Path(loop.output_dir) / "warnings.txt"
    assert not recorded.parent.exists()
    assert not [w for w in shown if "a warning of the run" in str(w.message)]
    assert history == fit_spec(spec, tmp_path / "spec")["history"]
