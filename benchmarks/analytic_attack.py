"""The analytic attack on an MLP's first layer (Phong et al., 2017): exact copies per batch size, digits and photos.

Victim: ``ImageClassifier("mlp")`` (Flatten, Linear(D, 256), ReLU, Linear(256, K), standardised inputs) at its
PyTorch initialisation, one gradient of B held-out images (the test split; photos: both splits, 81 crops), one victim
per seed. Per cell: the share of images copied exactly (PSNR >= 60 dB after matching), the share at PSNR >= 30 dB,
the mean PSNR (capped at 100 dB) and the label accuracy (bias-gradient counts). Prints one JSON line per cell.

Settings: ``configs/analytic_attack.yaml`` (``--config``); flags override them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from _config import parse_args
from _timing import clock

from lightning_fl.attacks import AnalyticLinearAttack
from lightning_fl.attacks.metrics import label_recovery_accuracy, match_reconstructions, psnr
from lightning_fl.attacks.standalone import client_view
from lightning_fl.datamodules.datasets import load_dataset
from lightning_fl.models import ImageClassifier


def held_out(data: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Images, labels and classes the batches are drawn from."""
    splits = [load_dataset(data, train=False, image_size=32)]
    if data == "photos":
        splits.append(load_dataset(data, train=True, image_size=32))
    return torch.cat([s.images for s in splits]), torch.cat([s.labels for s in splits]), splits[0].num_classes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+")
    parser.add_argument("--batch-sizes", nargs="+", type=int)
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--config", type=Path, default=Path("configs/analytic_attack.yaml"))
    args = parse_args(parser)
    torch.set_num_threads(1)
    for data in args.data:
        images, labels, num_classes = held_out(data)
        for size in args.batch_sizes:
            exact = good = total = label_hits = seconds = 0.0
            psnrs = []
            for seed in range(args.seeds):
                torch.manual_seed(seed)
                model = ImageClassifier("mlp", num_classes=num_classes, in_channels=images.shape[1])
                index = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))[:size]
                view = client_view(model, images[index], labels[index], num_classes=num_classes)
                start = clock("cpu")
                reconstruction = AnalyticLinearAttack().reconstruct(view)
                seconds += clock("cpu") - start
                rows, cols = match_reconstructions(reconstruction.images, images[index])
                per_image = psnr(reconstruction.images[rows], images[index][cols])
                exact += float((per_image >= 60).sum())
                good += float((per_image >= 30).sum())
                total += size
                psnrs.append(float(per_image.mean()))
                label_hits += float(label_recovery_accuracy(reconstruction.labels, labels[index], num_classes))
            row = {
                "data": data,
                "batch_size": size,
                "exact": round(exact / total, 3),
                "psnr_30": round(good / total, 3),
            }
            row |= {"mean_psnr": round(sum(psnrs) / len(psnrs), 1), "label_accuracy": round(label_hits / args.seeds, 3)}
            print(json.dumps(row | {"cpu_s_per_attack": round(seconds / args.seeds, 3)}), flush=True)


if __name__ == "__main__":
    main()
