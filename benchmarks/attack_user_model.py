"""DLG's batch defaults on a user's own LightningModule: 2 RGB photo crops in one gradient (docs/attacks.md).

Section "Batch recovery". The victim is not one of ours: a small sigmoid CNN written as a user would write it
(``MyNet`` below), untrained. The attack is ``DLGAttack()`` with its defaults, whose ``"auto"`` settings for a
batch are a total-variation prior, no early stop and 6000 evaluations; ``--before`` runs the settings before the batch
priors (no prior, early stop at 3e-8, 3000 evaluations). Prints, per seed (victim init and attack start):
the photos, PSNR and SSIM per matched image, the recovered labels (the true ones are 1 and 4), evaluations and
process CPU seconds. The crops are the first two of different scikit-image photos, never used for tuning.

Run: ``OMP_NUM_THREADS=1 python benchmarks/attack_user_model.py [--before]``
"""

from __future__ import annotations

import argparse
import json

import lightning as L
import torch
import torch.nn.functional as F
from _timing import clock
from torch import nn

from lightning_fl.attacks import DLGAttack
from lightning_fl.attacks.metrics import match_reconstructions, psnr, ssim
from lightning_fl.attacks.standalone import client_view
from lightning_fl.datamodules.datasets import load_dataset


class MyNet(L.LightningModule):
    """A user's classifier: two strided sigmoid convolutions and a linear head, 32x32 RGB in."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 5, padding=2, stride=2), nn.Sigmoid(), nn.Conv2d(8, 8, 5, padding=2, stride=2), nn.Sigmoid()
        )
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", action="store_true", help="the settings before the batch defaults")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    args = parser.parse_args()
    torch.set_num_threads(1)
    before = {"tv_weight": 0.0, "stop_below": 3e-8, "max_iterations": 3000} if args.before else {}
    data = load_dataset("photos", train=True, image_size=32)
    held_out = [i for i, source in enumerate(data.sources) if source.startswith("skimage:")]
    first = held_out[0]
    second = next(i for i in held_out if data.sources[i].split("[")[0] != data.sources[first].split("[")[0])
    index = torch.tensor([first, second])
    images, labels = data.images[index], torch.tensor([1, 4])
    for seed in args.seeds:
        torch.manual_seed(seed)
        view = client_view(MyNet(), images, labels, num_classes=10)
        start = clock("cpu")
        reconstruction = DLGAttack(progress_bar=False, seed=seed, **before).reconstruct(view)
        seconds = clock("cpu") - start
        rows, cols = match_reconstructions(reconstruction.images, images)
        row = {
            "seed": seed,
            "photos": [data.sources[i] for i in index],
            "psnr": [round(float(v), 1) for v in psnr(reconstruction.images[rows], images[cols])],
            "ssim": [round(float(v), 3) for v in ssim(reconstruction.images[rows], images[cols])],
            "labels": sorted(reconstruction.labels.tolist()),
            "evaluations": reconstruction.info["iterations"],
            "cpu_s": round(seconds, 1),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
