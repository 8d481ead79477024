"""A tiny federation run as a script, for the DDP test (Lightning's launcher re-runs this script per rank).

    python tests/federation/ddp_run.py OUTPUT_DIR [DEVICES]

Writes, besides the loop's own output, ``fits_rank{r}.json``: the clients each rank trained, per round.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from lightning_fl import FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import KeyLocks
from tests.conftest import make_classifier


def main(output_dir: Path, devices: int) -> None:
    torch.set_num_threads(1)
    dm = FederatedDataModule("digits", num_clients=6, partition="dirichlet", alpha=0.5, image_size=16, seed=0)
    torch.manual_seed(0)
    trainer = {"accelerator": "cpu", "strategy": "ddp", "devices": devices} if devices > 1 else None
    loop = FederatedLoop(
        make_classifier(dm),
        dm,
        num_rounds=3,
        clients_per_round=4,
        local_steps=3,
        defences=[KeyLocks(key_length=16)],
        trainer=trainer,
        output_dir=output_dir,
        progress_bar=False,
    )
    fits: list[tuple[int, int]] = []
    fit, record = loop.runner.fit, output_dir / f"fits_rank{os.environ.get('LOCAL_RANK', 0)}.json"

    def counted(ctx, received, **kwargs):
        fits.append((ctx.round_idx, ctx.client_id))
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(fits))  # before the result goes back: complete when rank 0 finishes
        return fit(ctx, received, **kwargs)

    loop.runner.fit = counted
    summary = loop.fit()
    if summary:
        print("SUMMARY", json.dumps(summary["history"]))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1)
