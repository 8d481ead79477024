"""DLG rows of the thesis' Table 3.4 (PSNR at B = 1) and Table 3.6 (largest batch recovered), reduced scale.

Setting of the thesis' ch. 3 (Ren 2023, spec_003 §1.6-1.7): the untrained sigmoid DLG LeNet with U(-0.5, 0.5)
weights, one shared gradient, DLG with L-BFGS; here on 32x32 scikit-learn digits (MNIST is not offline) and with
the budget of ``iterations`` L-BFGS iterations and ``restarts`` batched restarts. "Recovered" is the
operational proxy SSIM >= ``success_ssim`` (0.6) per image (the FedKL code's ASR threshold; the thesis says
"visually recognisable", spec_003 G9). Both PSNR conventions are printed: the toolkit's and the thesis code's RMSE
variant. The settings are in ``configs/dlg_thesis_tables.yaml``; a flag overrides its key.

Run: ``OMP_NUM_THREADS=1 python benchmarks/dlg_thesis_tables.py`` (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json

import torch
from _config import parse_args

from lightning_fl.attacks import DLGAttack
from lightning_fl.attacks.metrics import attack_success_rate, match_reconstructions, score_reconstruction, ssim
from lightning_fl.attacks.standalone import client_view
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.messages import GroundTruth
from lightning_fl.models import ImageClassifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/dlg_thesis_tables.yaml", help="the settings; flags override")
    parser.add_argument("--batch-sizes", type=int, nargs="+")
    parser.add_argument("--iterations", type=int)
    parser.add_argument("--restarts", type=int)
    parser.add_argument("--image-size", type=int)
    parser.add_argument("--success-ssim", type=float)
    args = parse_args(parser)
    torch.set_num_threads(1)
    dm = FederatedDataModule(**args.fit["data"], image_size=args.image_size)
    for batch_size in args.batch_sizes:
        torch.manual_seed(0)
        model = ImageClassifier("lenet_dlg", **dm.model_options)
        images, labels = dm.sample_batch(0, batch_size, seed=0)
        view = client_view(model, images, labels, num_classes=10)
        attack = DLGAttack(max_iterations=args.iterations, restarts=args.restarts, progress_bar=False)
        reconstruction = attack.reconstruct(view)
        scores = score_reconstruction(reconstruction, GroundTruth(images, labels), num_classes=10)
        rows, cols = match_reconstructions(reconstruction.images, images)
        per_image = ssim(reconstruction.images[rows], images[cols])
        success = attack_success_rate(per_image, threshold=args.success_ssim)
        scores[f"success_rate_ssim_{args.success_ssim}"] = float(success)
        row = {"batch_size": batch_size, "iterations": args.iterations, "restarts": args.restarts, **scores}
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}))


if __name__ == "__main__":
    main()
