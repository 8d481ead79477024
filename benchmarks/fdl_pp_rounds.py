"""FDL-PP Table 1 accuracy against training length: passports in 1 or in all 3 private convolutions, vs plain DL.

Issue 14: in benchmarks/defence_tables.py (10 rounds) passports in the paper's three private convolutions cost 7.6
accuracy points that the paper (Table 1, MNIST) does not see. This runs the same setting longer and records the
curve: 16x16 digits, 5 IID clients all every round, sigmoid DLG LeNet, Adam 2e-3, batch 32, 2 local epochs; with
passports, accuracy is the mean over clients of their own model (private layers stay local) after 10 steps of
private fine-tuning, as in the table.

Writes ``<out>/curves.csv`` (setting, seed, round, test_accuracy, cpu_s) and prints one curve per run. Not in CI::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fdl_pp_rounds.py --rounds 30 --seeds 0 1
"""

from __future__ import annotations

import argparse
import copy
import csv
import tempfile
import time
import warnings
from pathlib import Path

import torch

from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import Passports, PrivateFineTuning, apply_defences
from lightning_fl.federation import FederatedLoop
from lightning_fl.models import ImageClassifier

IMAGE_SIZE = 16
SETTINGS = {
    "DL": 0,
    "FDL-PP (conv 1)": 1,
    "FDL-PP (convs 1-3)": 3,
}
"""Setting name -> number of passport convolutions (0: plain FedAvg)."""


def run(passports: int, *, rounds: int, seed: int, every: int) -> tuple[list[tuple[int, float]], float]:
    dm = FederatedDataModule("digits", num_clients=5, partition="iid", image_size=IMAGE_SIZE, batch_size=32, seed=seed)
    torch.manual_seed(seed)
    defences = [Passports(num_convs=passports, passport_size=IMAGE_SIZE)] if passports else []
    model = apply_defences(ImageClassifier("lenet_dlg", **dm.model_options), [copy.deepcopy(d) for d in defences])
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loop = FederatedLoop(
            model, dm, num_rounds=rounds, clients_per_round=5, local_epochs=2,
            client_callbacks=[PrivateFineTuning(steps=10)] if passports else [],
            eval_on="clients" if passports else "global", eval_every=every, checkpoint=False, progress_bar=False,
            output_dir=out, seed=seed,
        )  # fmt: skip
        start = time.process_time()
        history = loop.fit()["history"]
        cpu = time.process_time() - start
    return [(i, h["test_accuracy"]) for i, h in enumerate(history) if "test_accuracy" in h], cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--every", type=int, default=5, help="evaluate every this many rounds")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS))
    parser.add_argument("--out", type=Path, default=Path("runs/fdl_pp_rounds"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "curves.csv"
    new_file = not csv_path.exists()
    with csv_path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=("setting", "seed", "round", "test_accuracy", "cpu_s"))
        if new_file:
            writer.writeheader()
        for seed in args.seeds:
            for name in args.settings:
                curve, cpu = run(SETTINGS[name], rounds=args.rounds, seed=seed, every=args.every)
                writer.writerows(
                    {"setting": name, "seed": seed, "round": r, "test_accuracy": a, "cpu_s": round(cpu, 1)}
                    for r, a in curve
                )
                f.flush()
                points = " ".join(f"{r}:{a:.3f}" for r, a in curve)
                print(f"{name} seed={seed}: {points} ({cpu:.0f} CPU s)", flush=True)


if __name__ == "__main__":
    main()
