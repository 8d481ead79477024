"""Tiny runs of four shipped configs give the histories recorded before the round was split into explicit steps.

``data/round_histories.json`` holds, per run, the history (timings left out) and the sum of squares of each tensor of
the final global state. It was recorded with the code before the refactor; regenerate it only when a change is
meant to change results: ``python -m tests.federation.test_round_parity --record`` from the repository root.
On the recording machine the match is exact. On another CPU the float kernels round differently, so the test
compares what does not depend on them: continuous values to a relative 1e-6; the test accuracy, a count of test images,
to ``ACCURACY_IMAGES`` images (a rounding difference can flip an image near the decision boundary: a key-lock run read
0.11476 = 206/1795 on one CPU, 0.11588 = 208/1795 on another); and the global state without the tensors a
normalisation cancels (``CANCELLED``).
One column was re-recorded since, on purpose: the Paillier run's ``he_download_bytes`` now counts FedBoosting's
cross-validation downloads (the shared models reach the clients through ``decode_aggregate``, as the aggregate does);
every other value of that run was unchanged by that change.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_fl.cli import main
from lightning_fl.federation.checkpoint import Checkpoint

RECORDED = Path(__file__).parent / "data" / "round_histories.json"
CONFIGS = Path(__file__).parents[2] / "configs"
COMMON = [
    "--loop.num_rounds",
    "2",
    "--loop.progress_bar",
    "false",
    "--data.image_size",
    "16",
    "--loop.local_steps",
    "3",
]
RUNS = {
    "quickstart": ["--config", str(CONFIGS / "quickstart.yaml")],
    "fedkl": ["--config", str(CONFIGS / "fedkl_digits.yaml"), "--loop.callbacks", "[]"],
    "paillier": [
        "--config", str(CONFIGS / "fedboosting_he_digits.yaml"), "--loop.client_transforms.init_args.key_size", "512",
    ],
    "fed_cdp": ["--config", str(CONFIGS / "fed_cdp_digits.yaml")],
}  # fmt: skip


TEST_IMAGES = 1795  # the digits test set of these runs: every recorded accuracy is a whole number of its images
ACCURACY_IMAGES = 3  # test images a CPU's rounding may flip: more than the two seen, far below a change of behaviour
CANCELLED = {
    "fedkl": ("backbone.body.0.0.bias", "backbone.body.0.1.norm.running_mean"),
}  # a conv bias right before a normalisation has a zero gradient in exact arithmetic; Adam scales the rounding noise
# of that zero to full steps, so the bias (and the running mean tracking it) follows the CPU, the outputs do not


def run(name: str, output_dir: Path) -> dict[str, Any]:
    """The history (without timings) and final-state fingerprint of one tiny run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit", *RUNS[name], *COMMON, "--output_dir", str(output_dir)]) == 0
    history = json.loads((output_dir / "summary.json").read_text())["history"]
    state = torch.load(Checkpoint(output_dir).server_path, weights_only=True)["global_state"]
    return {
        "history": [{k: v for k, v in h.items() if not k.endswith("_s")} for h in history],
        "global_state": {k: float(v.double().square().sum()) for k, v in state.items()},
    }


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "paillier" else n for n in RUNS]
)  # Paillier: ~10 s of encryption on 2 cores
def test_a_tiny_run_gives_the_recorded_history(tmp_path, name) -> None:
    recorded = json.loads(RECORDED.read_text())[name]
    now = run(name, tmp_path)
    assert [sorted(h) for h in now["history"]] == [sorted(h) for h in recorded["history"]]
    for mine, theirs in zip(now["history"], recorded["history"], strict=True):
        floats = [k for k, v in theirs.items() if isinstance(v, float)]
        assert {k: v for k, v in mine.items() if k not in floats} == {
            k: v for k, v in theirs.items() if k not in floats
        }
        continuous = [k for k in floats if k != "test_accuracy"]
        assert {k: mine[k] for k in continuous} == pytest.approx({k: theirs[k] for k in continuous}, rel=1e-6, abs=1e-9)
        if "test_accuracy" in theirs:
            images = ACCURACY_IMAGES / TEST_IMAGES
            assert mine["test_accuracy"] == pytest.approx(theirs["test_accuracy"], abs=images)
    kept = [k for k in recorded["global_state"] if k not in CANCELLED.get(name, ())]
    assert {k: now["global_state"][k] for k in kept} == pytest.approx(
        {k: recorded["global_state"][k] for k in kept}, rel=1e-6
    )


def test_the_recorded_accuracies_are_whole_numbers_of_test_images() -> None:
    for run_name, recorded in json.loads(RECORDED.read_text()).items():
        for entry in recorded["history"]:
            images = entry["test_accuracy"] * TEST_IMAGES
            assert images == pytest.approx(round(images), abs=1e-3), (run_name, entry["round"])


def test_the_recorded_paillier_downloads_are_the_aggregate_and_each_fused_model() -> None:
    # every message is one model's ciphertexts, an N-th of the N clients' upload: 1 aggregate + N fused models for
    # cross-validation; the training losses are the clients' own models, which they hold in plaintext
    for entry in json.loads(RECORDED.read_text())["paillier"]["history"]:
        n = len(entry["clients"])
        assert entry["he_download_bytes"] == (1 + n) * entry["he_upload_bytes"] / n


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    import tempfile

    results = {}
    for run_name in RUNS:
        with tempfile.TemporaryDirectory() as folder:
            results[run_name] = run(run_name, Path(folder))
    RECORDED.write_text(json.dumps(results, indent=1) + "\n")
