"""DP-SGD (`PerExampleDP`) on a user's own LightningModule in a plain Lightning Trainer, with and without passport
and key-lock layers, for both noise scalings: test accuracy, epsilon and CPU time.

The setting of ``tests/defences/test_per_example_dp_lightning.py``: the user ``DigitsNet`` of
``tests/user_project.py`` (an 8-channel CNN), 1,500 sklearn digits for training and 297 for testing, B = 32,
SGD lr 0.1 with momentum 0.9, 2 epochs, sigma = 1, C = 1 (flat clipping), delta = 1e-5. About a minute on one CPU
core; not run in CI::

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/dp_user_model.py
    PYTHONPATH=. python benchmarks/dp_user_model.py --device cuda    # the same on a GPU (seeded noise on CUDA)
"""

from __future__ import annotations

import argparse
import time
import warnings

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_fl.defences import PerExampleDP, add_keylock, add_passports
from tests.user_project import DigitsNet, digits_tensors


def run(defence: str, noise_scaling: str, *, device: str = "cpu") -> dict[str, float]:
    """Train the user model once with DP-SGD and return its test accuracy, epsilon and CPU seconds."""
    torch.manual_seed(0)
    model = DigitsNet(lr=0.1)
    if defence == "passport":
        add_passports(model, num_convs=1, passport_size=8)
    elif defence == "keylock":
        add_keylock(model, key_length=64, norm="group")
    x, y = digits_tensors()
    train = DataLoader(TensorDataset(x[:1500], y[:1500]), batch_size=32, shuffle=True)
    test = DataLoader(TensorDataset(x[1500:], y[1500:]), batch_size=512)
    dp = PerExampleDP(noise_multiplier=1.0, max_grad_norm=1.0, noise_scaling=noise_scaling, seed=0)
    trainer = L.Trainer(
        max_epochs=2, callbacks=[dp], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="gpu" if device == "cuda" else "cpu", devices=1,
    )  # fmt: skip
    start = time.process_time()
    trainer.fit(model, train)
    seconds = time.process_time() - start
    epsilon = trainer.callback_metrics["epsilon"].item()
    accuracy = trainer.test(model, test, verbose=False)[0]["test_acc"]
    return {"test_accuracy": accuracy, "epsilon": epsilon, "cpu_seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    device = parser.parse_args().device
    warnings.filterwarnings("ignore")
    print("| model | noise_scaling | test accuracy | epsilon | CPU s |\n|---|---|---|---|---|")
    for defence in ("none", "passport", "keylock"):
        for scaling in ("per_batch", "per_example"):
            row = run(defence, scaling, device=device)
            print(
                f"| {defence} | {scaling} | {row['test_accuracy']:.3f} | {row['epsilon']:.2f} | "
                f"{row['cpu_seconds']:.1f} |"
            )


if __name__ == "__main__":
    main()
