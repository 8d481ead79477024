"""Secure aggregation cost on the quickstart: SecAgg pairwise masking vs packed Paillier vs plain FedAvg.

Section "Masking vs Paillier: cost" of docs/secure_aggregation.md. Runs ``configs/quickstart.yaml`` (10 digits
clients, 5 a round, 3 local epochs, LeNet of 32x32 inputs) through ``lightning-fl fit`` for a few rounds per
protocol and prints one row each: wall seconds per round, the protocol's own seconds per round (clients' masking or
encryption, the server's unmasking or ciphertext sums, decryption) and bytes each client uploads per round.

Run: ``OMP_NUM_THREADS=1 python benchmarks/secagg_cost.py [--rounds 3] [--paillier-rounds 1]``
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from lightning_fl.cli import main

CONFIG = Path(__file__).parents[1] / "configs" / "quickstart.yaml"
PROTOCOLS = {
    "FedAvg (plaintext)": [],
    "SecAgg masking": ["--defences", "[{class_path: lightning_fl.defences.SecAggMasking}]"],
    "Paillier packed, 2048-bit": [
        "--defences",
        "[{class_path: lightning_fl.defences.PaillierEncryption, init_args: {key_size: 2048}}]",
        "--loop.aggregator",
        "lightning_fl.defences.SecureFedAvg",
    ],
}


def run(name: str, rounds: int, output: Path) -> dict[str, float]:
    """Fit the quickstart for ``rounds`` rounds under one protocol; returns its per-round costs."""
    args = ["fit", "--config", str(CONFIG), "--output_dir", str(output), "--loop.num_rounds", str(rounds)]
    args += ["--loop.progress_bar", "false", "--loop.eval_every", str(rounds), *PROTOCOLS[name]]
    start = time.perf_counter()
    assert main(args) == 0
    wall = (time.perf_counter() - start) / rounds
    history = json.loads((output / "summary.json").read_text())["history"]
    mean = lambda key: sum(h.get(key, 0.0) for h in history) / len(history)  # noqa: E731
    clients = sum(len(h["clients"]) for h in history) / len(history)
    if name.startswith("SecAgg"):
        protocol_s = mean("secagg_mask_s") + mean("secagg_unmask_s")
        upload = mean("secagg_upload_bytes") + mean("secagg_response_bytes")
    elif name.startswith("Paillier"):
        protocol_s = mean("he_encrypt_s") + mean("he_aggregate_s") + mean("he_decrypt_s")
        upload = mean("he_upload_bytes") / clients
    else:
        protocol_s, upload = 0.0, 4.0 * _parameters(output)
    return {"s_per_round": wall, "protocol_s": protocol_s, "upload_bytes": upload}


def _parameters(output: Path) -> int:
    from safetensors.torch import load_file

    return sum(t.numel() for t in load_file(str(output / "global_model.safetensors")).values())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paillier-rounds", type=int, default=1)
    options = parser.parse_args()
    print("| protocol | rounds | wall s / round | protocol s / round | upload bytes / client / round |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in PROTOCOLS:
            rounds = options.paillier_rounds if name.startswith("Paillier") else options.rounds
            cost = run(name, rounds, Path(tmp) / name.split()[0])
            print(
                f"| {name} | {rounds} | {cost['s_per_round']:.2f} | {cost['protocol_s']:.3f} | "
                f"{cost['upload_bytes']:,.0f} |"
            )
