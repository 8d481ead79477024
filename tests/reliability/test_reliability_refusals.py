"""Settings that protect nothing are refused before anything is written, with one line (exit 2).

On main before this suite: secure aggregation (Paillier, SecAgg) over one client a round ran; FedSDP given in
``defences`` and again in ``loop.client_transforms`` clipped and noised every update twice while KeyLocks listed
twice was refused; and a Python ``FederatedLoop`` with ``trainer={"enable_checkpointing": True}`` on a key-locked
model wrote each client's lock into ``lightning_logs/`` (only the command refused it).
"""

from __future__ import annotations

import pytest
import torch

from lightning_fl import FederatedLoop
from lightning_fl.cli import main
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import FedSDP, KeyLocks, SecAggMasking
from tests.conftest import make_classifier
from tests.reliability.helpers import FAST, QUICKSTART, one_error_line

PAILLIER = "{class_path: lightning_fl.defences.PaillierEncryption, init_args: {max_weight_sum: 4096}}"
FED_SDP = "{class_path: lightning_fl.defences.FedSDP, init_args: {noise_multiplier: 1.0, max_grad_norm: 4.0}}"

CASES = {
    "paillier, one client a round": (
        [
            "--defences",
            f"[{PAILLIER}]",
            "--loop.aggregator",
            "lightning_fl.defences.SecureFedAvg",
            "--loop.clients_per_round",
            "1",
        ],
        "PaillierEncryption aggregates one client a round (loop.clients_per_round=1)",
    ),
    "secagg, one client a round": (
        ["--defences", "[{class_path: lightning_fl.defences.SecAggMasking}]", "--loop.clients_per_round", "1"],
        "SecAggMasking aggregates one client a round",
    ),
    "FedSDP in defences and client_transforms": (
        ["--defences", f"[{FED_SDP}]", "--loop.client_transforms", f"[{FED_SDP}]"],
        "loop.client_transforms[1]=FedSDP repeats loop.client_transforms[0]; list each defence once",
    ),
    "FedSDP twice in client_transforms": (
        ["--loop.client_transforms", f"[{FED_SDP}, {FED_SDP}]"],
        "loop.client_transforms[1]=FedSDP repeats loop.client_transforms[0]",
    ),
    "key-lock twice": (
        ["--defences", "[{class_path: lightning_fl.defences.KeyLocks}, {class_path: lightning_fl.defences.KeyLocks}]"],
        "defences[1]=KeyLocks repeats defences[0]; list each defence once",
    ),
    "empty output_dir": (["--output_dir", ""], "output_dir='' is empty"),
}


@pytest.mark.parametrize(("args", "message"), list(CASES.values()), ids=list(CASES))
def test_a_setting_that_protects_nothing_exits_2_before_writing(tmp_path, capsys, monkeypatch, args, message) -> None:
    monkeypatch.chdir(tmp_path)  # an empty output_dir would mean here
    run = tmp_path / "run"
    code = main(["fit", "--config", str(QUICKSTART), "--output_dir", str(run), *FAST, *args])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2, line
    assert message in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _loop(tmp_path, **kwargs) -> FederatedLoop:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16, batch_size=32, seed=0)
    torch.manual_seed(0)
    return FederatedLoop(make_classifier(dm), dm, num_rounds=1, output_dir=tmp_path / "run", **kwargs)


def test_python_loop_refuses_secure_aggregation_of_one_client(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"SecAggMasking aggregates one client a round"):
        _loop(tmp_path, defences=[SecAggMasking()], clients_per_round=1)


def test_python_loop_refuses_a_defence_given_twice(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"loop.client_transforms\[1\]=FedSDP repeats"):
        _loop(tmp_path, defences=[FedSDP(noise_multiplier=1.0)], client_transforms=[FedSDP(noise_multiplier=1.0)])


@pytest.mark.parametrize("option", ["enable_checkpointing", "logger"])
def test_python_loop_refuses_client_trainers_that_write_private_state(tmp_path, monkeypatch, option) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=rf"loop.trainer.{option} would write each client's model with its private"):
        _loop(tmp_path, defences=[KeyLocks(key_length=8)], trainer={option: True})
    assert not (tmp_path / "lightning_logs").exists()


def test_python_loop_refuses_an_empty_output_dir() -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16, batch_size=32, seed=0)
    with pytest.raises(ValueError, match=r"output_dir='' is empty"):
        FederatedLoop(make_classifier(dm), dm, num_rounds=1, output_dir="")
