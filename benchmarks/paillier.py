"""Packed vs per-value Paillier encryption of one real update, and the per-round cost at 10 clients, in one run.

The update is a real client update: the sigmoid LeNet (15,226 parameters) after 3 local epochs on one
client of digits (10 clients, Dirichlet 0.5). All lines use the same key and the same values:

* packed: :func:`~lightning_fl.defences.secure_aggregation.paillier.encrypt_tensors` with BatchCrypt-style
  packing (default spec);
* per value: the same fixed-point encoding with one value per ciphertext (``packing=False``);
* phe native: ``public_key.encrypt(float)`` per value, as the thesis' reference code does.

Per-value encryption of the whole update takes ~4 minutes at 2048 bits, so the per-value lines run on the
first ``--sample`` values of the update and report time per value; the packed line runs on the whole update
and on the same sample. Then 10 clients each encrypt their own update, the server combines the ciphertexts
with SecureFedAvg's integer weights (sample counts) and one client decrypts the aggregate.

    .venv/bin/python benchmarks/paillier.py --key-size 2048 --sample 1000
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from lightning_fl import ClientUpdate, FederatedCallback, scratch_loop
from lightning_fl.defences.secure_aggregation.paillier import (
    PackingSpec,
    decrypt_tensors,
    encrypt_tensors,
    generate_keypair,
    weighted_sum,
)

T = TypeVar("T")


class UpdateRecorder(FederatedCallback):
    """Keeps the update of each client fit (the copy ``on_client_fit_end`` receives)."""

    def __init__(self) -> None:
        self.updates: list[ClientUpdate] = []

    def on_client_fit_end(self, federation: Any, update: ClientUpdate) -> None:
        self.updates.append(update)


def client_updates(num_clients: int) -> tuple[list[dict[str, torch.Tensor]], list[int]]:
    """Real LeNet updates of ``num_clients`` digits clients (3 local epochs each, one round in which every client
    trains) and their sample counts, as the loop hands them to its FL callbacks."""
    spec = {
        "seed": 0,
        "data": {"dataset": "digits", "num_clients": num_clients, "partition": "dirichlet", "alpha": 0.5},
        "model": {
            "class_path": "lightning_fl.models.ImageClassifier",
            "init_args": {"backbone": "lenet_dlg", "lr": 2e-3},
        },
        "loop": {"local_epochs": 3, "num_rounds": 1, "clients_per_round": num_clients, "eval_every": 0},
    }
    recorder = UpdateRecorder()
    with scratch_loop(spec, callbacks=[recorder]) as loop:
        loop.fit()
    updates = sorted(recorder.updates, key=lambda u: u.client_id)
    return [u.delta for u in updates], [u.num_samples for u in updates]


def timed(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    """``fn(*args, **kwargs)`` and its wall time in seconds."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key-size", type=int, default=2048)
    parser.add_argument("--sample", type=int, default=1000, help="values encrypted one per ciphertext")
    parser.add_argument("--clients", type=int, default=10)
    args = parser.parse_args()

    deltas, counts = client_updates(args.clients)
    packed_spec = PackingSpec(key_size=args.key_size)
    per_value_spec = PackingSpec(key_size=args.key_size, packing=False)
    public_key, private_key = generate_keypair(spec=packed_spec)
    update = deltas[0]
    flat = torch.cat([v.reshape(-1) for v in update.values()])
    sample = {"sample": flat[: args.sample]}
    n_values, n_sample = flat.numel(), sample["sample"].numel()
    print(f"key {args.key_size} bits, update of {n_values} values, |max| {flat.abs().max():.3g}, sample {n_sample}")
    print(f"packing: {packed_spec.slots} values per plaintext, {packed_spec.slot_bits}-bit slots, step 2^-20\n")

    full, t_full = timed(encrypt_tensors, update, public_key=public_key, spec=packed_spec)
    _, t_packed_sample = timed(encrypt_tensors, sample, public_key=public_key, spec=packed_spec)
    _, t_per_value = timed(encrypt_tensors, sample, public_key=public_key, spec=per_value_spec)
    _, t_phe = timed(lambda: [public_key.encrypt(float(x)) for x in sample["sample"].tolist()])
    ciphertext_bytes = full.nbytes // len(full.ciphertexts)
    rows = [
        ("packed, whole update", t_full / n_values, len(full.ciphertexts), full.nbytes),
        ("packed, same sample", t_packed_sample / n_sample, None, None),
        ("per value (packing=False), sample", t_per_value / n_sample, n_values, n_values * ciphertext_bytes),
        ("phe encrypt(float) per value, sample", t_phe / n_sample, n_values, None),
    ]
    print("| encryption of one update | ms per value | whole update (s) | ciphertexts | bytes |")
    print("|---|---|---|---|---|")
    for name, per_value, ciphertexts, nbytes in rows:
        print(
            f"| {name} | {1e3 * per_value:.4f} | {per_value * n_values:.1f} | "
            f"{ciphertexts if ciphertexts is not None else ''} | {nbytes if nbytes is not None else ''} |"
        )
    print(f"\npacked / per-value time: 1/{t_per_value / n_sample / (t_full / n_values):.0f} (whole update vs sample)")
    print(f"packed / per-value time on the same sample: 1/{t_per_value / t_packed_sample:.0f}")
    print(f"plaintext float32 update: {4 * n_values} bytes; packed ciphertexts: {full.nbytes} bytes\n")

    encrypted, t_encrypt = [], []
    for delta in deltas:
        item, elapsed = timed(encrypt_tensors, delta, public_key=public_key, spec=packed_spec)
        encrypted.append(item)
        t_encrypt.append(elapsed)
    aggregate, t_aggregate = timed(weighted_sum, encrypted, weights=counts, normaliser=sum(counts))
    result, t_decrypt = timed(decrypt_tensors, aggregate, private_key=private_key)
    expected = {k: sum(n * d[k] for n, d in zip(counts, deltas, strict=True)) / sum(counts) for k in deltas[0]}
    error = max((result[k] - expected[k]).abs().max().item() for k in expected)
    print(f"| one round, {args.clients} clients, packed | seconds |")
    print("|---|---|")
    median = statistics.median(t_encrypt)
    print(f"| encryption, all clients (sequential) | {sum(t_encrypt):.2f} (median {median:.2f} per client) |")
    print(f"| aggregation on the server (weights n_k) | {t_aggregate:.2f} |")
    print(f"| decryption of the aggregate (one client) | {t_decrypt:.2f} |")
    print(f"| upload, all clients | {sum(e.nbytes for e in encrypted) / 1e6:.2f} MB |")
    print(f"| download per client | {aggregate.nbytes / 1e6:.2f} MB |")
    print(f"\nmax |encrypted FedAvg - plaintext FedAvg| = {error:.2e} (bound 2^-21 = {2**-21:.2e})")


if __name__ == "__main__":
    main()
