"""Largest batch recovered (thesis Table 3.6) by DLG, iDLG and GRNN, on 32x32 digits and on natural photos.

Victim: the untrained sigmoid DLG LeNet (U(-0.5, 0.5) weights, [0, 1] pixels in, 10 classes), one shared gradient
of a batch of B distinct images (distinct labels where the data has them: iDLG's rule needs them). Attacks with
their shipped defaults except the budget: DLG and iDLG ``max_iterations = --iterations`` (``tv_weight`` and
``stop_below`` "auto": for B > 1 a total-variation prior of 1e-3 and no early stop; flags override them),
GRNN ``iterations = --grnn-iterations`` with the thesis' LeNet settings (``configs/grnn_lenet_lfw.yaml``).
A batch counts as recovered when every matched image has SSIM >= 0.6 (the FedKL code's ASR threshold; the thesis
says "visually recognisable"). One process runs one (attack, data, B) cell, so cells can run in parallel.

Settings: ``configs/batch_recovery.yaml`` (``--config``); flags override them, e.g.
``OMP_NUM_THREADS=1 python benchmarks/batch_recovery.py --attack dlg --data photos --batch-size 4``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from _config import parse_args
from _timing import clock

from lightning_fl.attacks import GRNN, DLGAttack, IDLGAttack
from lightning_fl.attacks.metrics import match_reconstructions, psnr, ssim
from lightning_fl.attacks.standalone import client_view, view_on
from lightning_fl.datamodules.datasets import load_dataset
from lightning_fl.models import ImageClassifier


def batch(data: str, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """B images with distinct labels (digits) or from distinct photos and crops (photos, held-out photos first)."""
    dataset = load_dataset(data, train=True, image_size=32)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    if data == "photos":  # scikit-image photos (held out of tuning) first, one crop per photo while they last
        rank = {i: k for k, i in enumerate(order)}
        order.sort(key=lambda i: (dataset.sources[i].startswith("sklearn"), rank[i]))
    chosen, labels = [], set()
    for i in order:
        label = int(dataset.labels[i])
        if label not in labels or len(labels) == dataset.num_classes:
            chosen.append(i)
            labels.add(label)
        if len(chosen) == size:
            break
    index = torch.tensor(chosen)
    return dataset.images[index], dataset.labels[index] % 10, dataset.images.shape[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attack", choices=["dlg", "idlg", "grnn"])
    parser.add_argument("--data", choices=["digits", "photos"])
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--iterations", type=int, help="DLG/iDLG max_iterations.")
    parser.add_argument(
        "--stop-below",
        type=float,
        help="DLG/iDLG stop_below (relative gradient distance); 0: no early stop (default: the attack's, auto).",
    )
    parser.add_argument("--restarts", type=int, help="DLG/iDLG restarts (default: the attack's).")
    parser.add_argument("--keep-best-after", type=int, help="DLG/iDLG keep_best_after (default: the attack's).")
    parser.add_argument("--init", choices=["rand", "randn"], help="DLG/iDLG start (default: the attack's, rand).")
    parser.add_argument(
        "--tv-weight", type=float, help="DLG/iDLG total-variation prior weight (default: the attack's, auto)."
    )
    parser.add_argument("--grnn-iterations", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--device", default="cpu", help="cuda: wall seconds after synchronising instead of CPU s.")
    parser.add_argument(
        "--config", type=Path, default=Path("configs/batch_recovery.yaml"), help="settings file; flags override it"
    )
    args = parse_args(parser)
    torch.set_num_threads(1)
    images, labels, channels = batch(args.data, args.batch_size, args.seed)
    torch.manual_seed(args.seed)
    model = ImageClassifier("lenet_dlg", num_classes=10, in_channels=channels, standardize=False)
    view = view_on(client_view(model, images, labels, num_classes=10), args.device)
    if args.attack == "grnn":
        settings = {"lr": 1e-4, "momentum": 0.99, "tv_weight": 1e-3, "loss": "l2_tv_squared"}
        attack = GRNN(iterations=args.grnn_iterations, progress_bar=False, **settings)
    else:
        make = DLGAttack if args.attack == "dlg" else IDLGAttack
        options = {} if args.stop_below is None else {"stop_below": args.stop_below or None}
        passed = ("restarts", "keep_best_after", "init", "tv_weight")
        options |= {k: v for k in passed if (v := getattr(args, k)) is not None}
        attack = make(max_iterations=args.iterations, progress_bar=False, seed=args.seed, **options)
    start = clock(args.device)
    reconstruction = attack.reconstruct(view)
    seconds = clock(args.device) - start
    rows, cols = match_reconstructions(reconstruction.images, images)
    per_ssim = ssim(reconstruction.images[rows], images[cols])
    per_psnr = psnr(reconstruction.images[rows], images[cols])
    print(
        json.dumps(
            {
                "attack": args.attack,
                "data": args.data,
                "batch_size": args.batch_size,
                "recovered": bool((per_ssim >= 0.6).all()),
                "images_recovered": int((per_ssim >= 0.6).sum()),
                "mean_psnr": round(float(per_psnr.mean()), 1),
                "mean_ssim": round(float(per_ssim.mean()), 3),
                "iterations": reconstruction.info.get("iterations"),
                "relative_gap": reconstruction.info.get("relative_gap"),
                "cpu_s" if args.device == "cpu" else "wall_s": round(seconds, 1),
                "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
