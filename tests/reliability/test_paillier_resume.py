"""A Paillier key survives a restart: stored as strings, restored with torch.load(weights_only=True)."""

from __future__ import annotations

import json
import pickle
import warnings

import pytest
import torch

from lightning_fl.cli import main
from lightning_fl.defences.secure_aggregation.paillier import (
    PackingSpec,
    decrypt_tensors,
    encrypt_tensors,
    generate_keypair,
    private_key_from_state,
    private_key_state,
)
from lightning_fl.defences.secure_aggregation.protocol import KEY_FIELD
from lightning_fl.federation.checkpoint import Checkpoint
from tests.reliability.helpers import CONFIGS

HE_CONFIG = CONFIGS / "fedboosting_he_digits.yaml"


@pytest.fixture(scope="module")
def key_2048():
    return generate_keypair(spec=PackingSpec(key_size=2048, max_weight_sum=4))


def test_a_2048_bit_key_round_trips_through_a_safe_load(key_2048, tmp_path) -> None:
    public_key, private_key = key_2048
    spec = PackingSpec(key_size=2048, max_weight_sum=4)
    torch.save({"extra": {KEY_FIELD: private_key_state(private_key)}}, tmp_path / "client_0.pt")
    restored = private_key_from_state(torch.load(tmp_path / "client_0.pt", weights_only=True)["extra"][KEY_FIELD])
    assert restored == private_key and restored.public_key.n.bit_length() == 2048
    values = {"w": torch.tensor([0.5, -0.25, 1.0])}
    encrypted = encrypt_tensors(values, public_key=public_key, spec=spec)
    assert torch.equal(decrypt_tensors(encrypted, private_key=restored)["w"], values["w"])


def test_a_2048_bit_integer_is_what_the_safe_load_refuses(key_2048, tmp_path) -> None:
    """The failure the string storage avoids (why the old integer storage could never resume)."""
    torch.save({"n": key_2048[1].public_key.n}, tmp_path / "int.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "int.pt", weights_only=True)


def test_a_corrupt_stored_key_is_refused() -> None:
    with pytest.raises(ValueError, match=r"p \* q != n"):
        private_key_from_state({"n": "23", "p": "3", "q": "5"})
    with pytest.raises(ValueError, match=r"lacks \['q'\]"):
        private_key_from_state({"n": "f", "p": "3"})


def _he_run(output_dir, *extra: str, key_size: int) -> list[str]:
    return [
        "fit", "--config", str(HE_CONFIG), "--output_dir", str(output_dir), "--data.image_size", "16",
        "--loop.local_epochs", "1", "--loop.progress_bar", "false",
        "--loop.client_transforms.init_args.key_size", str(key_size), *extra,
    ]  # fmt: skip


def _stored_key(output_dir) -> dict:
    return torch.load(Checkpoint(output_dir).client_path(0), weights_only=True)["extra"][KEY_FIELD]


def _resume_keeps_the_key(tmp_path, key_size: int) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*below 2048 bits.*")
        assert main(_he_run(tmp_path, "--loop.num_rounds", "1", key_size=key_size)) == 0
        key = _stored_key(tmp_path)
        assert main(_he_run(tmp_path, "--loop.num_rounds", "2", "--resume", "true", key_size=key_size)) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [h["round"] for h in summary["history"]] == [0, 1]
    assert _stored_key(tmp_path) == key  # the clients kept their key; no new ceremony on resume
    assert int(key["n"], 16).bit_length() == key_size


def test_fedboosting_he_run_resumes_with_its_key(tmp_path) -> None:
    _resume_keeps_the_key(tmp_path, key_size=512)


@pytest.mark.slow
def test_fedboosting_he_run_resumes_with_the_shipped_2048_bit_key(tmp_path) -> None:
    """configs/fedboosting_he_digits.yaml as shipped (2048 bits), 1 + 1 rounds: about 35 s on one core."""
    _resume_keeps_the_key(tmp_path, key_size=2048)
