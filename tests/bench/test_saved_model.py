"""``fit`` exports the public global model as safetensors; ``test``/``validate`` score it; secrets stay out."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from lightning_fl.cli import main
from lightning_fl.defences import KeyLocks, apply_defences
from lightning_fl.federation.export import load_global_model, save_global_model
from lightning_fl.private import private_state, public_state
from tests.conftest import make_classifier

_SMALL = ["-c", "configs/quickstart.yaml", "--loop.num_rounds", "2", "--data.num_clients", "4"]
_SMALL += ["--loop.clients_per_round", "2", "--loop.local_epochs", "1", "--loop.progress_bar", "false"]


def test_fit_exports_the_global_model_and_test_reproduces_its_accuracy(tmp_path, capsys) -> None:
    assert main(["fit", *_SMALL, "--output_dir", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    capsys.readouterr()
    assert main(["test", *_SMALL, "--output_dir", str(tmp_path)]) == 0
    printed = dict(line.split(": ") for line in capsys.readouterr().out.splitlines() if line.startswith("test_"))
    assert float(printed["test_acc"]) == pytest.approx(summary["test_accuracy"], abs=1e-4)
    assert main(["validate", *_SMALL, "--output_dir", str(tmp_path)]) == 0
    assert "val_acc" in capsys.readouterr().out
    wrong = ["test", *_SMALL, "--data.image_size", "16", "--ckpt_path", str(tmp_path / "global_model.safetensors")]
    assert main(wrong) == 2
    assert "does not fit the configured model" in capsys.readouterr().err


def test_export_holds_public_tensors_only(tiny_digits, tmp_path) -> None:
    model = make_classifier(tiny_digits)
    apply_defences(model, [KeyLocks()])
    assert private_state(model)  # the key-lock's keys and locks
    stored = load_file(save_global_model(model, tmp_path / "g.safetensors"))
    assert set(stored) == set(public_state(model)) and not set(stored) & set(private_state(model))
    fresh = make_classifier(tiny_digits)
    apply_defences(fresh, [KeyLocks()])
    load_global_model(fresh, tmp_path / "g.safetensors")
    assert all((fresh.state_dict()[k] == v).all() for k, v in stored.items())
