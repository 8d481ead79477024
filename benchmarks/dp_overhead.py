"""Fed-CDP's cost: one local epoch with per-example DP (Opacus) against a non-private epoch and a micro-batch loop.

Fed-CDP (Wei et al., ICDCS 2021, Table III) reports 3-4x the non-private time per local iteration; the authors'
code computes per-example gradients one example at a time (a micro-batch loop). This script times, on one client's
data (digits, 32x32, the sigmoid DLG LeNet, B examples per step, SGD):

* ``nonprivate``: a Lightning Trainer epoch, no DP;
* ``fed_cdp``: the same epoch with :class:`~lightning_fl.defences.PerExampleDP` (Opacus per-sample gradients,
  per-layer clipping, noise on every example);
* ``microbatch``: the same Fed-CDP step written as the original code does it: one backward per example, per-layer
  clip, Gaussian noise per example, average (plain PyTorch, no Lightning overhead).

Run: ``OMP_NUM_THREADS=1 python benchmarks/dp_overhead.py --samples 500 --batch-size 5 --repeats 3``
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset

from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import PerExampleDP
from lightning_fl.models import ImageClassifier

_TRAINER = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
_TRAINER |= {"enable_model_summary": False, "accelerator": "cpu", "max_epochs": 1}


def _model(dm: FederatedDataModule) -> ImageClassifier:
    return ImageClassifier("lenet_dlg", **dm.model_options, optimizer="sgd", lr=0.05)


def _lightning_epoch(model: ImageClassifier, loader: DataLoader, callbacks: list) -> float:
    start = time.perf_counter()
    L.Trainer(callbacks=callbacks, **_TRAINER).fit(model, loader)
    return time.perf_counter() - start


def _microbatch_epoch(model: ImageClassifier, loader: DataLoader, *, sigma: float, clip: float) -> float:
    """Fed-CDP Alg. 2 as the original code computes it: per-example backward, per-layer clip, per-example noise."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.05)
    start = time.perf_counter()
    for images, labels in loader:
        total = [torch.zeros_like(p) for p in params]
        for x, y in zip(images, labels, strict=True):
            grads = torch.autograd.grad(F.cross_entropy(model(x[None]), y[None]), params)
            for acc, g in zip(total, grads, strict=True):
                acc += g / torch.clamp(g.norm() / clip, min=1.0) + sigma * clip * torch.randn_like(g)
        for p, acc in zip(params, total, strict=True):
            p.grad = acc / len(labels)
        optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500, help="client data size (paper's MNIST client: 500)")
    parser.add_argument("--batch-size", type=int, default=5, help="local batch B (paper's MNIST: 5)")
    parser.add_argument("--repeats", type=int, default=3, help="epochs timed per variant; the minimum is reported")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    dm = FederatedDataModule("digits", num_clients=1, partition="iid", image_size=32, val_fraction=0.0)
    data = Subset(dm.client_train_set(0), range(args.samples))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = _model(dm)
    _lightning_epoch(model, loader, [])  # warm-up (imports, allocator)
    times: dict[str, list[float]] = {"nonprivate": [], "fed_cdp": [], "microbatch": []}
    for _ in range(args.repeats):
        times["nonprivate"].append(_lightning_epoch(model, loader, []))
        times["fed_cdp"].append(
            _lightning_epoch(model, loader, [PerExampleDP(noise_multiplier=6.0, max_grad_norm=4.0)])
        )
        times["microbatch"].append(_microbatch_epoch(model, loader, sigma=6.0, clip=4.0))
    best = {k: min(v) for k, v in times.items()}
    result = {
        "samples": args.samples,
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "seconds_per_epoch": best,
        "fed_cdp_over_nonprivate": best["fed_cdp"] / best["nonprivate"],
        "fed_cdp_over_microbatch": best["fed_cdp"] / best["microbatch"],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
