"""See-Through-Gradients (Yin et al., CVPR 2021) batch recovery on a batch-norm ResNet at 32x32, with its ablations.

Victim: ``ImageClassifier`` with a ResNet backbone on 32x32 digits, its BN running statistics accumulated over
another client's images in training mode (the broadcast model of a federation that trained on this kind of data:
the statistics the server holds); one gradient of B held-out test images (distinct labels up to 10, then the
``llg`` label rule, since Yin et al.'s rule assumes distinct labels). Each row runs the attack with its priors
(``full``), without the BN prior (``no_bn``) and without group consistency (``no_group``), same start and budget.

Settings: ``configs/see_through_gradients_table.yaml`` (``--config``); flags override them, e.g.
``OMP_NUM_THREADS=1 python benchmarks/see_through_gradients.py --batch-sizes 1 --iterations 300``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from _config import parse_args
from _timing import clock

from lightning_fl.attacks import SeeThroughGradientsAttack
from lightning_fl.attacks.metrics import label_recovery_accuracy, match_reconstructions, psnr, ssim
from lightning_fl.attacks.standalone import client_view, view_on
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.models import ImageClassifier

VARIANTS = {"full": {}, "no_bn": {"bn_weight": 0.0}, "no_group": {"group_weight": 0.0}}


def victim(dm: FederatedDataModule, backbone: str, seed: int) -> ImageClassifier:
    """The ResNet with BN running statistics of client 1's images (cumulative average, training mode)."""
    torch.manual_seed(seed)
    model = ImageClassifier(**dm.model_options, backbone=backbone)
    public, _ = dm.client_train_set(1).tensors()
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum = None
    with torch.no_grad():
        for chunk in public.split(64):
            model.train()(chunk)
    return model


def held_out_batch(dm: FederatedDataModule, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` test images, distinct labels while there are classes left."""
    order = torch.randperm(len(dm.test_set), generator=torch.Generator().manual_seed(seed)).tolist()
    chosen, labels = [], set()
    for i in order:
        label = int(dm.test_set[i][1])
        if label not in labels or len(labels) == dm.num_classes:
            chosen.append(i)
            labels.add(label)
        if len(chosen) == size:
            break
    images, targets = zip(*(dm.test_set[i] for i in chosen), strict=True)
    return torch.stack(images), torch.stack(targets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+")
    parser.add_argument("--iterations", type=int)
    parser.add_argument("--restarts", type=int)
    parser.add_argument("--backbone")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--device", default="cpu", help="cuda: wall seconds after synchronising instead of CPU s.")
    parser.add_argument(
        "--config", type=Path, default=Path("configs/see_through_gradients_table.yaml"), help="settings; flags override"
    )
    args = parse_args(parser)
    torch.set_num_threads(1)
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=32, val_fraction=0.0)
    dm.setup()
    rows = []
    for batch in args.batch_sizes:
        for seed in args.seeds:
            images, labels = held_out_batch(dm, batch, seed)
            view = client_view(victim(dm, args.backbone, seed), images, labels, num_classes=dm.num_classes)
            for variant in args.variants:
                attack = SeeThroughGradientsAttack(
                    max_iterations=args.iterations,
                    restarts=args.restarts,
                    label_strategy="yin" if batch <= dm.num_classes else "llg",
                    progress_bar=False,
                    seed=seed,
                    **VARIANTS[variant],
                )
                start = clock(args.device)
                result = attack.reconstruct(view_on(view, args.device))
                seconds = clock(args.device) - start
                rows_, cols = match_reconstructions(result.images, images)
                row = {
                    "B": batch,
                    "seed": seed,
                    "variant": variant,
                    "psnr": round(float(psnr(result.images[rows_], images[cols]).mean()), 2),
                    "ssim": round(float(ssim(result.images[rows_], images[cols]).mean()), 3),
                    "label_accuracy": float(label_recovery_accuracy(result.labels, labels, dm.num_classes)),
                    "seconds": round(seconds, 1),
                    "device": args.device,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
