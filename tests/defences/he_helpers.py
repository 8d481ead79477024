"""Helpers shared by the secure-aggregation and FedBoosting tests: small Paillier loops and a key-leak search."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from phe.paillier import PaillierPrivateKey
from torch import Tensor

from lightning_fl import FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences.secure_aggregation.protocol import PaillierEncryption
from tests.conftest import make_classifier

KEY_SIZE = 512  # tests only (insecure; PaillierEncryption warns)


def digits(**kwargs: object) -> FederatedDataModule:
    options = {"num_clients": 3, "partition": "dirichlet", "alpha": 0.5, "image_size": 16, "seed": 0, **kwargs}
    return FederatedDataModule("digits", **options)


def he_transform(**kwargs: object) -> PaillierEncryption:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PaillierEncryption(key_size=KEY_SIZE, **kwargs)


def run_loop(output_dir: Path, *, dm: FederatedDataModule | None = None, **kwargs: object) -> FederatedLoop:
    """One round of 2 local steps on every client of ``dm`` (3 small digits clients by default)."""
    torch.manual_seed(0)
    dm = dm or digits()
    options = {"num_rounds": 1, "local_steps": 2, "eval_every": 0, **kwargs}
    loop = FederatedLoop(
        make_classifier(dm), dm, clients_per_round=dm.num_clients, output_dir=output_dir, progress_bar=False, **options
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*below 2048 bits.*")
        loop.fit()
    return loop


def reachable(root: object, *, skip: tuple[type, ...] = ()) -> Iterator[object]:
    """Every object reachable from ``root`` through attributes and containers (tensors are leaves)."""
    seen, stack = set(), [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, dict):
            stack.extend([*obj.keys(), *obj.values()])
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif not isinstance(obj, Tensor | str | bytes | int | float) and hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())


def assert_holds_no_private_key(root: object, secret: dict[str, str], *, skip: tuple[type, ...] = ()) -> None:
    """No ``PaillierPrivateKey`` and neither prime of ``secret`` (as stored, or as an integer) is reachable."""
    primes = {int(secret["p"], 16), int(secret["q"], 16)}
    stored = {secret["p"], secret["q"]}
    for obj in reachable(root, skip=skip):
        assert not isinstance(obj, PaillierPrivateKey), f"a private key is reachable from {type(root).__name__}"
        assert not (type(obj) is int and obj in primes), f"a prime of the private key is reachable from {root!r}"
        assert not (type(obj) is str and obj in stored), f"a stored prime is reachable from {type(root).__name__}"
