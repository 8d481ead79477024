"""Inverting Gradients on the ReLU + BatchNorm ConvNet, one photo tile per gradient: which setting breaks it.

docs/attacks.md, "The models people train: a ReLU + BatchNorm ConvNet". The victim is
``ImageClassifier("convnet", standardize=False)`` (breaching's ConvNet shape at width 16; ``--backbone
convnet_small`` for width 8) at its seed-0 initialisation, in train mode (the client's batch statistics), FedSGD with
one tile of the ``photo_tiles`` data set. ``--setting`` names one of :data:`SETTINGS`; the attack is
:class:`~lightning_fl.attacks.GradientMatchingAttack` with Inverting Gradients' objective and that setting. Prints
the relative cosine gap, PSNR and SSIM every 100 iterations, the returned reconstruction's scores (the best
restart's best iterate, or with ``--set consensus=true`` the mean of the restarts' best iterates) and the process
CPU seconds per tile, and the means over the tiles.

Run: ``OMP_NUM_THREADS=1 python benchmarks/ig_relu_convnet.py --setting full --tiles 0 80 240 --iterations 2000``;
tiles by name and one setting changed: ``--sources 'sklearn:flower[2,3]' 'sklearn:china[2,2]' --set lr=0.1``;
another backbone: ``--backbone conv_bn_pool``.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import yaml

from lightning_fl.attacks import GradientMatchingAttack
from lightning_fl.attacks.gradient_matching import restart_consensus
from lightning_fl.attacks.metrics import psnr, ssim
from lightning_fl.attacks.standalone import client_view
from lightning_fl.datamodules.datasets import load_dataset
from lightning_fl.models import ImageClassifier

PAPER = {"distance": "cosine", "optimizer": "adam", "labels": "infer", "signed": True, "boxed": True, "lr_decay": True}
SETTINGS: dict[str, dict[str, object]] = {
    "shipped": {"lr": 0.1, "init": "randn", "tv_weight": 1e-4},  # InvertingGradientsAttack's defaults
    "pixel_units": {"lr": 0.025, "init": "image_randn", "tv_weight": 0.4},  # the code's schedule in [0, 1] pixels
    "leaked_bn": {"lr": 0.025, "init": "image_randn", "tv_weight": 0.4, "bn_statistics": "leaked", "bn_weight": 0.1},
    "full": {"lr": 0.025, "init": "image_randn", "tv_weight": 4.0, "bn_statistics": "leaked", "bn_weight": 0.1},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="full")
    parser.add_argument("--backbone", default="convnet")
    parser.add_argument("--tiles", type=int, nargs="+", default=[0, 80, 240])
    parser.add_argument("--sources", nargs="+", default=[], help="tiles by name, e.g. 'sklearn:flower[2,3]'")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="change the setting's options")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--restarts", type=int, default=1)
    parser.add_argument("--eval-mode", action="store_true", help="the client trains in eval mode (running stats)")
    args = parser.parse_args()
    data = load_dataset("photo_tiles", train=True, image_size=32)
    classes = int(data.labels.max()) + 1
    changes = {key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in args.set)}
    tiles = [data.sources.index(name) for name in args.sources] or args.tiles
    finals = []
    for tile in tiles:
        images = data.images[tile : tile + 1]
        images = images.float() / 255 if images.dtype == torch.uint8 else images
        torch.manual_seed(0)
        model = ImageClassifier(args.backbone, num_classes=classes, in_channels=3, image_size=32, standardize=False)
        model = model.eval() if args.eval_mode else model.train()
        view = client_view(model, images, data.labels[tile : tile + 1], num_classes=classes)
        if args.eval_mode:
            view = type(view)(view.leak_point, copy.deepcopy(model).eval(), view.tensors, view.kind, view.metadata)
        options = {**PAPER, **SETTINGS[args.setting], **changes}
        options |= {"max_iterations": args.iterations, "restarts": args.restarts}
        attack = GradientMatchingAttack(**options, progress_bar=False)
        start = time.process_time()
        for state in attack.iterate(view):
            if state.iteration % 100 == 99 or state.iteration == args.iterations - 1:
                best = int(state.relative_gaps.argmin())
                candidate = state.images[best].clamp(0, 1)
                scores = float(psnr(candidate, images).mean()), float(ssim(candidate, images).mean())
                gap = float(state.relative_gaps[best])
                print(f"tile {tile} it {state.iteration + 1}: gap {gap:.3f} psnr {scores[0]:.1f} ssim {scores[1]:.3f}")
        best = int(state.best_losses.nan_to_num(torch.inf).argmin())
        returned = restart_consensus(state.best_images, best=best) if attack.consensus else state.best_images[best]
        returned = returned.clamp(0, 1)
        finals.append((float(psnr(returned, images).mean()), float(ssim(returned, images).mean())))
        seconds = time.process_time() - start
        scored = f"psnr {finals[-1][0]:.2f} ssim {finals[-1][1]:.3f}"
        print(f"tile {tile} ({data.sources[tile]}): {scored}, {seconds:.0f} CPU s")
    means = [sum(values) / len(values) for values in zip(*finals, strict=True)]
    print(f"mean over {len(finals)} tiles: psnr {means[0]:.2f} ssim {means[1]:.3f}")


if __name__ == "__main__":
    main()
