"""Plug-ins that would run but do something else than asked are refused before training, with one line (exit 2).

Before: ``GaussianNoise(std 10)`` after ``PaillierEncryption`` added nothing, two encryptions froze the encrypted
layer, ``KeyLocks`` listed twice locked twice, ``SecureFedAvg`` averaged plaintext, and ``[Passports(), KeyLocks()]``
built another architecture than ``[KeyLocks(), Passports()]``. Defence arguments that cannot work (a negative
budget, a NaN noise) and a ``PrivacyBudget`` with nothing to account for failed after the run directory existed.
"""

from __future__ import annotations

import pytest
from torch import nn

from lightning_fl.cli import main
from lightning_fl.defences import KeyLocks, Passports, PrivateSplit, apply_defences
from lightning_fl.models import ImageClassifier
from tests.reliability.helpers import FAST, QUICKSTART, one_error_line

PAILLIER = "{class_path: lightning_fl.defences.PaillierEncryption, init_args: {max_weight_sum: 4096}}"
NOISE = "{class_path: lightning_fl.defences.GaussianNoise, init_args: {noise_std: %s, unit: update}}"
SECURE = ["--loop.aggregator", "lightning_fl.defences.SecureFedAvg"]
BUDGET = "[{class_path: lightning_fl.callbacks.PrivacyBudget, init_args: {target_epsilon: 5.0}}]"

CASES = {
    "noise after encryption": (
        ["--loop.client_transforms", f"[{PAILLIER}, {NOISE % 10}]", *SECURE],
        "run GaussianNoise after PaillierEncryption",
    ),
    "two encryptions": (["--loop.client_transforms", f"[{PAILLIER}, {PAILLIER}]", *SECURE], "encrypt twice"),
    "encryption as defence and transform": (
        ["--defences", f"[{PAILLIER}]", "--loop.client_transforms", f"[{PAILLIER}]", *SECURE],
        "encrypt twice",
    ),
    "key-lock twice": (
        ["--defences", "[{class_path: lightning_fl.defences.KeyLocks}, {class_path: lightning_fl.defences.KeyLocks}]"],
        "defences[1]=KeyLocks repeats defences[0]",
    ),
    "secure aggregation without encryption": (SECURE, "SecureFedAvg but no client transform encrypts"),
    "negative privacy budget": (
        ["--defences", "[{class_path: lightning_fl.defences.DualDPFL, init_args: {target_epsilon: -1}}]"],
        "DualDPFL(target_epsilon=-1.0) must be a finite number > 0",
    ),
    "NaN noise": (["--defences", f"[{NOISE % '.nan'}]"], "GaussianNoise(noise_std=nan) must be a finite number >= 0"),
    "budget without DP": (["--loop.callbacks", BUDGET], "PrivacyBudget but the run has no DP defence"),
    "Fed-CDP on a BatchNorm model": (
        ["--model.init_args.backbone", "convnet_small", "--defences", "[{class_path: lightning_fl.defences.FedCDP}]"],
        "FedCDP cannot compute per-example gradients through BatchNorm backbone.features.1 (BatchNorm2d)",
    ),
}


@pytest.mark.parametrize(("args", "message"), list(CASES.values()), ids=list(CASES))
def test_a_run_whose_plugins_do_not_compose_exits_2_before_writing(tmp_path, capsys, args, message) -> None:
    run = tmp_path / "run"
    code = main(["fit", "--config", str(QUICKSTART), "--output_dir", str(run), *FAST, *args])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2, line
    assert message in line
    assert not run.exists()


def _layout(model: nn.Module) -> list[tuple[str, str]]:
    return [(name, type(m).__name__) for name, m in model.named_modules()]


@pytest.mark.parametrize("backbone", ["lenet_dlg", "resnet20"])
def test_model_defences_give_one_architecture_whatever_their_order(backbone) -> None:
    def build(defences):
        model = ImageClassifier(backbone, num_classes=10, in_channels=3, image_size=32)
        return _layout(apply_defences(model, defences))

    keylock_first = build([KeyLocks(key_length=8), Passports()])
    assert build([Passports(), KeyLocks(key_length=8)]) == keylock_first
    assert build([PrivateSplit(), Passports(), KeyLocks(key_length=8)]) == keylock_first
    where = {kind: name for name, kind in reversed(keylock_first)}  # the first module of each kind
    assert not where["KeyLockNorm2d"].startswith(where["PassportConv2d"] + ".")  # after the passport, not inside
    locks = [name + "." for name, kind in keylock_first if kind == "KeyLockNorm2d"]
    plain_norms = [n for n, kind in keylock_first if kind == "BatchNorm2d" and not n.startswith(tuple(locks))]
    norms = [kind for _, kind in build([])].count("BatchNorm2d")
    assert len(plain_norms) == max(norms - 1, 0)  # the lock replaced the block's own normalisation
