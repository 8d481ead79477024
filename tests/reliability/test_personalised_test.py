"""``lightning-fl test`` scores a model with private layers as its clients run it, never from public weights alone.

Before: a key-lock + passport run scored 0.09 under ``test`` (the public global state with the layers' initial
private values: no client's model), without a word, while its ``eval_on: clients`` reported 0.24.
"""

from __future__ import annotations

import json

import pytest

from lightning_fl.cli import main
from tests.reliability.helpers import FAST, QUICKSTART, one_error_line

DEFENCES = (
    "[{class_path: lightning_fl.defences.Passports}, {class_path: lightning_fl.defences.KeyLocks, "
    "init_args: {key_length: 8}}]"
)
RUN = ["--config", str(QUICKSTART), *FAST, "--defences", DEFENCES, "--loop.clients_per_round", "3"]


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "run"
    args = ["--loop.local_epochs", "1", "--loop.eval_on", "clients"]
    assert main(["fit", *RUN, "--output_dir", str(run), *args]) == 0
    return run


def test_test_scores_the_clients_own_models_as_eval_on_clients_did(run, capsys) -> None:
    capsys.readouterr()
    assert main(["test", *RUN, "--output_dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "mean over the 3 trained clients' own models" in out
    scored = float(next(line for line in out.splitlines() if line.startswith("test_acc:")).split(":")[1])
    expected = json.loads((run / "summary.json").read_text())["test_accuracy"]
    assert scored == pytest.approx(expected, abs=5e-5)  # printed with 4 decimals


def test_test_refuses_a_private_model_without_its_clients_state(run, tmp_path, capsys) -> None:
    elsewhere = ["--output_dir", str(tmp_path / "elsewhere"), "--ckpt_path", str(run / "global_model.safetensors")]
    capsys.readouterr()
    assert main(["test", *RUN, *elsewhere]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "the model has private layers" in line and "holds no trained client's state" in line
