"""Robbing the Fed parity: this toolkit's block and read-out against breaching 0.1.2's, on the same victims and images.

Both sides in one run, per (data, seed): the same B images of one client, the same victim (the sigmoid LeNet
classifier, seeded), one gradient (FedSGD), k bins each. Ours: ``MaliciousImprint`` (``feature`` per dataset, as
in ``configs/robbing_the_fed_table.yaml``) and ``RobbingTheFedAttack``. breaching's: its ``ImprintBlock`` with the
defaults of its ``malicious-model-rtf`` server (``linfunc: fourier``, ``mode: 32``, ``gain: 1``,
``connection: linear``; ``num_bins`` set to k) on standardised images as breaching feeds them, and its own read-out
(``ImprintAttacker``: cumulative differences, ``invert_fc_layer``, ``reduce_hits`` with its ``imprint`` attack
defaults ``breach_reduction: weight``, ``breach_padding: true``), un-standardised for scoring. Score: the share of
the batch at PSNR >= 30 dB after matching.

breaching is never a dependency: install it outside the project's environment, e.g.
``pip download breaching==0.1.2 --no-deps`` (unzip the wheel to DIR) and ``pip install --target DEPS hydra-core``,
then ``PYTHONPATH=DIR:DEPS OMP_NUM_THREADS=1 python benchmarks/robbing_the_fed_parity.py``.
Settings: ``configs/robbing_the_fed_parity.yaml`` (``--config``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from _config import parse_args
from robbing_the_fed import one_client, server_imprint, victim

from lightning_fl.attacks import RobbingTheFedAttack
from lightning_fl.attacks.metrics import RECOVERED_PSNR, match_reconstructions, psnr
from lightning_fl.attacks.standalone import client_view
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import apply_defences


def share(recovered: torch.Tensor, truth: torch.Tensor) -> float:
    rows, cols = match_reconstructions(recovered.clamp(0, 1), truth)
    return float((psnr(recovered.clamp(0, 1)[rows], truth[cols]) >= RECOVERED_PSNR).sum()) / len(truth)


def breaching_side(
    dm: FederatedDataModule, victim: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, num_bins: int
) -> float:
    """breaching's block in front of ``victim`` and breaching's read-out, on standardised inputs."""
    from breaching.attacks.analytic_attack import ImprintAttacker
    from breaching.cases.malicious_modifications import ImprintBlock

    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in dm.input_stats)
    block = ImprintBlock(dm.input_shape, num_bins, connection="linear", gain=1.0, linfunc="fourier", mode=32)
    model = torch.nn.Sequential(block, victim)
    loss = torch.nn.functional.cross_entropy(model((images - mean) / std), labels)
    weight, bias = (g.detach().clone() for g in torch.autograd.grad(loss, [block.linear0.weight, block.linear0.bias]))
    for i in reversed(range(1, weight.shape[0])):  # ImprintAttacker.reconstruct, structure "cumulative"
        weight[i] -= weight[i - 1]
        bias[i] -= bias[i - 1]
    inputs = ImprintAttacker.invert_fc_layer(None, weight, bias, [])
    attacker = SimpleNamespace(cfg=SimpleNamespace(breach_padding=True, breach_reduction="weight"))
    inputs = ImprintAttacker.reduce_hits(
        attacker, inputs, weight, bias, [{"metadata": {"num_data_points": len(images)}}]
    )
    return share(inputs.reshape(-1, *dm.input_shape) * std + mean, images)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--num-bins", type=int)
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument(
        "--config", type=Path, default=Path("configs/robbing_the_fed_parity.yaml"), help="settings; flags override"
    )
    args = parse_args(parser)
    torch.set_num_threads(1)
    rows = []
    for data, feature in args.sweep["features"].items():
        dm, pool, pool_labels = one_client(data)
        for seed in args.seeds:
            chosen = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))[: args.batch_size]
            images, labels = pool[chosen], pool_labels[chosen]
            torch.manual_seed(seed)
            their_victim = victim(dm)
            start = time.process_time()
            ours_model = apply_defences(victim(dm), [server_imprint(dm, feature=feature, num_bins=args.num_bins)])
            ours_model.load_state_dict(their_victim.state_dict(), strict=False)  # the same victim behind both blocks
            view = client_view(ours_model, images, labels, num_classes=dm.num_classes)
            ours = share(RobbingTheFedAttack().reconstruct(view).images, images)
            middle = time.process_time()
            theirs = breaching_side(dm, their_victim, images, labels, args.num_bins)
            row = {
                "data": data,
                "seed": seed,
                "B": args.batch_size,
                "num_bins": args.num_bins,
                "ours": ours,
                "breaching": theirs,
                "ours_cpu_s": round(middle - start, 2),
                "breaching_cpu_s": round(time.process_time() - middle, 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
