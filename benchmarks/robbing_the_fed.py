"""Robbing the Fed (Fowl et al., ICLR 2022): share of a batch copied out exactly (PSNR >= 30 dB), and what defences do.

``--part batch``: one client's gradient of B images (FedSGD) or its update of T local SGD steps of B images each
(FedAvg, B x T images behind it), on 32x32 digits (bins on a random direction) and photo tiles (bins on the mean
brightness); the server's feature statistics come from the test split. ``--part defences``: 1-round federated
runs of B = 64 digits per client, one local step, with the malicious server in ``server_plugins`` and the attack
as a ``GradientLeakage`` callback at ``client_update``; the secure-aggregation row attacks the aggregate of K
clients, which is what secure aggregation hands the server.

Settings: ``configs/robbing_the_fed_table.yaml`` (``--config``); flags override them, e.g.
``OMP_NUM_THREADS=1 python benchmarks/robbing_the_fed.py --part batch --seeds 0``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from _config import parse_args

from lightning_fl.attacks import ImprintBlock, MaliciousImprint, RobbingTheFedAttack
from lightning_fl.attacks.metrics import RECOVERED_PSNR, match_reconstructions, psnr
from lightning_fl.attacks.standalone import client_view
from lightning_fl.bench import build_loop
from lightning_fl.callbacks import GradientLeakage
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.models import ImageClassifier
from lightning_fl.transforms import apply_server_plugins

VICTIM = {"backbone": "lenet_dlg", "optimizer": "sgd"}
"""The victim every row attacks: the sigmoid LeNet classifier, trained by SGD (``lr`` from the settings)."""


def server_imprint(dm: FederatedDataModule, *, feature: str, num_bins: int, gain: float = 1.0) -> MaliciousImprint:
    """The malicious server's block, its bins placed by the feature's mean and spread on the test split."""
    test = torch.stack([dm.test_set[i][0] for i in range(len(dm.test_set))])
    h = ImprintBlock(dm.input_shape, num_bins=2, feature=feature, feature_mean=0.0, feature_std=1.0).feature(test)
    return MaliciousImprint(
        num_bins=num_bins, feature=feature, feature_mean=float(h.mean()), feature_std=float(h.std()), gain=gain
    )


def victim(dm: FederatedDataModule, lr: float = 0.01) -> ImageClassifier:
    """A fresh victim for the data of ``dm`` (initialised from torch's current seed)."""
    return ImageClassifier(**dm.model_options, **VICTIM, lr=lr)


def one_client(data: str) -> tuple[FederatedDataModule, torch.Tensor, torch.Tensor]:
    """The 32x32 ``data`` as one client's training pool: its data module, images and labels."""
    dm = FederatedDataModule(data, num_clients=1, partition="iid", image_size=32, val_fraction=0.0)
    dm.setup()
    return dm, *dm.client_train_set(0).tensors()


def batch_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for data, feature in args.sweep["features"].items():
        dm, images, labels = one_client(data)
        for batch in args.batch_sizes:
            for steps in args.local_steps:
                if batch * steps > len(images):
                    rows.append({"data": data, "B": batch, "T": steps, "note": f"only {len(images)} images"})
                    continue
                shares = []
                for seed in args.seeds:
                    torch.manual_seed(seed)
                    model = apply_server_plugins(
                        victim(dm, args.lr), [server_imprint(dm, feature=feature, num_bins=args.num_bins)]
                    )
                    chosen = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))[: batch * steps]
                    truth = images[chosen]
                    view = client_view(
                        model, truth, labels[chosen], num_classes=dm.num_classes, local_steps=steps, lr=args.lr
                    )
                    recovered = RobbingTheFedAttack().reconstruct(view).images
                    rows_, cols = match_reconstructions(recovered, truth)
                    shares.append(float((psnr(recovered[rows_], truth[cols]) >= RECOVERED_PSNR).sum()) / len(truth))
                rows.append({"data": data, "feature": feature, "B": batch, "T": steps, "shares": shares})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def defence_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    data = {"dataset": "digits", "num_clients": 20, "partition": "iid", "image_size": 32, "val_fraction": 0.0}
    data["batch_size"] = 64
    server_data = FederatedDataModule(**data)  # the split the server measures its bins on
    rows = []
    for name, setting in args.sweep["defences"].items():
        leak_point = setting.get("leak_point", "client_update")
        clients = int(setting.get("clients_per_round", 1))
        gain = float(setting.get("gain", 1.0))
        spec = {
            "seed": 0,
            "data": data,
            "model": {"class_path": "lightning_fl.models.ImageClassifier", "init_args": {**VICTIM, "lr": args.lr}},
            "server_plugins": [server_imprint(server_data, feature="random", num_bins=args.num_bins, gain=gain)],
            "defences": setting.get("defences", []),
            "loop": {
                "num_rounds": 1,
                "clients_per_round": clients,
                "local_steps": 1,
                "eval_every": 0,
                **setting.get("loop", {}),
            },
        }
        leak = GradientLeakage(
            RobbingTheFedAttack(), leak_point=leak_point, rounds=[0], max_images=4096, save_images=False
        )
        with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loop = build_loop(spec, out, callbacks=[leak])
            start = time.process_time()
            loop.fit()
            entries = json.loads((Path(out) / "summary.json").read_text())["attacks"]
        leaked = 64 * (clients if leak_point == "aggregate" else 1)
        recovered = [e.get("recovered", 0) for e in entries]
        rows.append(
            {
                "defence": name,
                "gain": gain,
                "leak_point": leak_point,
                "images_behind_view": leaked,
                "shares": [r / leaked for r in recovered],
                "readable": [e.get("readable", True) for e in entries],
                "cpu_s": round(time.process_time() - start, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["batch", "defences"])
    parser.add_argument("--batch-sizes", type=int, nargs="+")
    parser.add_argument("--local-steps", type=int, nargs="+")
    parser.add_argument("--num-bins", type=int)
    parser.add_argument("--lr", type=float, help="the clients' SGD step size")
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument(
        "--config", type=Path, default=Path("configs/robbing_the_fed_table.yaml"), help="settings file; flags override"
    )
    args = parse_args(parser)
    torch.set_num_threads(1)
    rows = batch_rows(args) if args.part == "batch" else defence_rows(args)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
