"""Resume refuses a changed setting that changes results, and an older client file put back with a new digest.

On main before this suite: ``--resume true`` accepted another ``loop.trainer`` (``gradient_clip_val: 0.1`` turned
round 1's loss from 1.41 into 8.27), another ``loop.max_update_norm`` and another ``loop.eval_on`` (one history
mixing global and client accuracy), and resumed from a client file of an older round put back under the committed
name with its SHA-256 re-hashed into the manifest.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from lightning_fl.cli import main
from tests.reliability.helpers import FAST, QUICKSTART, one_error_line

KEY_LOCK = ["--defences", "[{class_path: lightning_fl.defences.KeyLocks, init_args: {key_length: 8}}]"]
NOISE = ["--defences", "[{class_path: lightning_fl.defences.GaussianNoise, init_args: {noise_std: 0.01}}]"]
USER_DATA = ["--data.dataset", "{class_path: tests.user_project.DigitsDataModule, init_args: {batch_size: 16}}"]
USER_DATA += ["--data.batch_size", "null", "--data.image_size", "null"]  # the DataModule's own batches, as it is
SMALL = [*FAST, "--data.num_clients", "4", "--loop.clients_per_round", "4", "--loop.local_steps", "1"]


def _fit(run, *extra: str) -> list[str]:
    return ["fit", "-c", str(QUICKSTART), "--output_dir", str(run), *SMALL, "--loop.eval_every", "0", *extra]


@pytest.mark.parametrize(
    ("before", "after", "named"),
    [
        (
            [],
            ["--loop.trainer", "{accelerator: cpu, gradient_clip_val: 0.1}"],
            "loop.trainer.gradient_clip_val: None -> 0.1",
        ),
        ([], ["--loop.max_update_norm", "5.0"], "loop.max_update_norm: 1000000.0 -> 5.0"),
        ([], ["--loop.max_update_norm_ratio", "null"], "loop.max_update_norm_ratio: 1000.0 -> None"),
        ([], ["--loop.eval_on", "clients"], "loop.eval_on: 'global' -> 'clients'"),
        # keys as the command line writes them, not the fingerprint's (defences[0].noise_std, seed, data.batch_size)
        (NOISE, [*NOISE, "--defences.0.init_args.noise_std", "0.02"], "defences.0.init_args.noise_std: 0.01 -> 0.02"),
        ([], ["--seed_everything", "1"], "seed_everything: 0 -> 1; data.seed: 0 -> 1"),
        (
            USER_DATA,
            [*USER_DATA, "--data.dataset.init_args.batch_size", "8"],
            "data.dataset.init_args.batch_size: 16 -> 8",
        ),
    ],
    ids=["gradient_clip_val", "max_update_norm", "max_update_norm_ratio", "eval_on", "defence", "seed", "datamodule"],
)
def test_resume_with_a_changed_setting_exits_2_naming_it(tmp_path, capsys, before, after, named) -> None:
    assert main(_fit(tmp_path, *before)) == 0
    manifest = (tmp_path / "manifest.json").read_bytes()
    capsys.readouterr()
    code = main(_fit(tmp_path, "--loop.num_rounds", "2", "--resume", "true", *after))
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and f"holds a run with other settings ({named}); resume with" in line, line
    assert (tmp_path / "manifest.json").read_bytes() == manifest


def test_resume_on_other_devices_or_with_a_progress_bar_is_allowed(tmp_path) -> None:
    assert main(_fit(tmp_path)) == 0
    extra = ["--loop.trainer", "{accelerator: cpu, devices: 1, enable_progress_bar: false}", "--resume", "true"]
    assert main(_fit(tmp_path, "--loop.num_rounds", "2", *extra)) == 0


def test_resume_refuses_an_older_client_file_put_back_with_a_rehashed_digest(tmp_path, capsys) -> None:
    run = tmp_path / "run"  # key-locked clients keep their locks in committed client files
    assert main(_fit(run, *KEY_LOCK)) == 0
    shutil.copytree(run / "clients", tmp_path / "round1")  # a copy kept after round 1
    assert main(_fit(run, *KEY_LOCK, "--loop.num_rounds", "2", "--resume", "true")) == 0
    manifest = json.loads((run / "manifest.json").read_text())
    slot, entry = next((k, e) for k, e in manifest["clients"].items() if e["path"].endswith("_r00002.pt"))
    older = (tmp_path / "round1" / f"client_{slot}_r00001.pt").read_bytes()
    (run / entry["path"]).write_bytes(older)  # the older file under the committed name ...
    entry["sha256"] = hashlib.sha256(older).hexdigest()  # ... and its digest re-hashed into the manifest
    (run / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(_fit(run, *KEY_LOCK, "--loop.num_rounds", "3", "--resume", "true")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"holds client {slot}'s state of round 1 but the manifest names round 2" in line
