"""``--resume true`` refuses any change of a plug-in's arguments, privacy settings first, and stores no secret.

The fingerprint used to hold plug-in class names only: a FedSDP run resumed with ``noise_multiplier`` 0.1 instead
of 6.0 ran on (epsilon 0.36 -> 94), and so did a changed ``GaussianNoise`` std or pruning ratio.
"""

from __future__ import annotations

import json

import pytest
import torch

from lightning_fl import FederatedLoop
from lightning_fl.cli import main
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import GaussianNoise, GradientPruning, KeyLocks
from lightning_fl.federation.checkpoint import describe_changes, fingerprint_changes
from lightning_fl.federation.fingerprint import plugin_settings
from tests.conftest import make_classifier
from tests.reliability.helpers import CONFIGS, one_error_line

FED_SDP = CONFIGS / "fed_sdp_digits.yaml"
SIGMA = "--loop.client_transforms.init_args.noise_multiplier"


def _fed_sdp(run, *extra: str) -> list[str]:
    fast = ["--data.image_size", "16", "--data.num_clients", "4", "--loop.local_steps", "1", "--loop.eval_every", "0"]
    return ["fit", "-c", str(FED_SDP), "--output_dir", str(run), *fast, "--loop.progress_bar", "false", *extra]


def test_resume_with_another_noise_multiplier_exits_2_naming_it_first(tmp_path, capsys) -> None:
    assert main(_fed_sdp(tmp_path, "--loop.num_rounds", "1", SIGMA, "6.0")) == 0
    manifest = (tmp_path / "manifest.json").read_bytes()
    capsys.readouterr()
    code = main(
        _fed_sdp(tmp_path, "--loop.num_rounds", "2", SIGMA, "0.1", "--loop.local_steps", "2", "--resume", "true")
    )
    line = one_error_line(capsys.readouterr().err)
    assert code == 2
    changes = line.split("other settings (", 1)[1]
    assert changes.startswith("loop.client_transforms.0.init_args.noise_multiplier: 6.0 -> 0.1; ")  # as typed
    assert "loop.local_steps: 1 -> 2" in changes  # after the privacy setting
    assert (tmp_path / "manifest.json").read_bytes() == manifest  # the run is untouched
    assert len(json.loads((tmp_path / "summary.json").read_text())["history"]) == 1


def _loop(tmp_path, defences) -> FederatedLoop:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16, batch_size=32, seed=0)
    torch.manual_seed(0)
    return FederatedLoop(make_classifier(dm), dm, defences=defences, num_rounds=1, output_dir=tmp_path)


@pytest.mark.parametrize(
    ("before", "after", "key"),
    [
        (GaussianNoise(noise_std=10.0), GaussianNoise(noise_std=0.01), "defences[0].noise_std: 10.0 -> 0.01"),
        (GradientPruning(ratio=0.9), GradientPruning(ratio=0.1), "defences[0].ratio: 0.9 -> 0.1"),
        (KeyLocks(key_length=8), KeyLocks(key_length=8, lock_act="relu"), "defences[0].lock_act: 'none' -> 'relu'"),
    ],
    ids=["noise std", "pruning ratio", "key-lock activation"],
)
def test_the_fingerprint_names_a_changed_defence_argument(tmp_path, before, after, key) -> None:
    changes = fingerprint_changes(_loop(tmp_path, [before]).fingerprint(), _loop(tmp_path, [after]).fingerprint())
    assert describe_changes(changes).startswith(key)


def test_the_same_settings_give_the_same_fingerprint(tmp_path) -> None:
    first = _loop(tmp_path, [GaussianNoise(noise_std=0.1), KeyLocks(key_length=8)]).fingerprint()
    assert first == _loop(tmp_path, [GaussianNoise(noise_std=0.1), KeyLocks(key_length=8)]).fingerprint()
    assert json.loads(json.dumps(first)) == first  # what the manifest stores reads back equal


class _HoldsSecrets:
    def __init__(self) -> None:
        self.api_key, self.client_secret, self.key_size = "sk-live-0123456789", b"\x01\x02", 2048
        self.keys = torch.arange(4.0)


def test_secrets_enter_the_fingerprint_as_digests_only() -> None:
    settings = plugin_settings({"loop.callbacks": [_HoldsSecrets()]})
    stored = json.dumps(settings)
    assert "sk-live" not in stored and "\\u0001" not in stored and "0.0, 1.0" not in stored
    assert settings["loop.callbacks[0].key_size"] == 2048  # a size is a setting, not a secret
    assert settings["loop.callbacks[0].api_key"].startswith("digest ")
