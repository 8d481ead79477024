"""What one faulty client does to a federation: FedAvg of the sigmoid LeNet on digits, 4 IID clients, all selected
every round, 3 rounds of 20 local steps, client 1 faulty in one way per line:

* ``paillier clear x1e20``: Paillier secure aggregation (512-bit key) of ``backbone.fc.bias``, the other layers sent
  in the clear; client 1 multiplies its clear layers by 1e20 after encrypting (a malicious client's encoder);
* ``num_samples=<n>``: client 1 reports ``n`` training samples (it holds 324), the FedAvg weight of its update.

Each line prints the largest absolute global weight, the test accuracy after round 3 and the clients aggregated in
round 0 (or why the run stopped). docs/architecture.md ("Checkpoints and resume", update checks) holds the results.

    .venv/bin/python benchmarks/faulty_updates.py

With ``--robust``, the quickstart (configs/quickstart.yaml) instead, honest and with one client a round (the
lowest-numbered selected one) scaling its update by ``--scale``, under FedAvg and each robust aggregator
(:mod:`lightning_fl.server.robust`); one markdown row per run: docs/algorithms.md ("Robust aggregation").

    .venv/bin/python benchmarks/faulty_updates.py --robust [--scale 50] [--rounds 25] [--only NormBounding]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import yaml

from lightning_fl import ClientUpdate, CoordinateMedian, FedAvg, Krum, NormBounding, TrimmedMean, scratch_loop
from lightning_fl.callbacks import FederatedCallback
from lightning_fl.defences import PaillierEncryption, SecureFedAvg
from lightning_fl.transforms import ClientTransform

QUICKSTART = Path(__file__).parents[1] / "configs" / "quickstart.yaml"


class _ScalesClearLayers(PaillierEncryption):
    def __call__(self, update: ClientUpdate, *, ctx: Any) -> ClientUpdate:
        sent = super().__call__(update, ctx=ctx)
        if update.client_id != 1:
            return sent
        return dataclasses.replace(sent, delta={k: v * 1e20 for k, v in sent.delta.items()})


class _ClaimsSamples(ClientTransform):
    def __init__(self, num_samples: float) -> None:
        self.num_samples = num_samples

    def __call__(self, update: ClientUpdate, *, ctx: Any) -> ClientUpdate:
        return update if update.client_id != 1 else dataclasses.replace(update, num_samples=self.num_samples)


class ScalesUpdate(ClientTransform, FederatedCallback):
    """A faulty client a round: the lowest-numbered selected client multiplies its update by ``scale``.

    Give the same object in ``loop.client_transforms`` and ``loop.callbacks`` (it reads the selection at the start
    of each round); the clients must train in this process (``loop.workers: 1``).
    """

    def __init__(self, scale: float) -> None:
        self.scale, self.faulty = scale, -1

    def on_round_start(self, federation: Any, round_idx: int, selected: list[int]) -> None:
        self.faulty = min(selected)

    def __call__(self, update: ClientUpdate, *, ctx: Any) -> ClientUpdate:
        if update.client_id != self.faulty:
            return update
        return dataclasses.replace(update, delta={k: v * self.scale for k, v in update.delta.items()})


def quickstart_spec() -> dict[str, Any]:
    """configs/quickstart.yaml as a :func:`~lightning_fl.scratch_loop` spec."""
    config = yaml.safe_load(QUICKSTART.read_text())
    return {"seed": config["seed_everything"], "data": config["data"], "model": config["model"], "loop": config["loop"]}


ROBUST = {
    "FedAvg": FedAvg,
    "NormBounding": lambda: NormBounding(factor=2.0),
    "CoordinateMedian": CoordinateMedian,
    "TrimmedMean": lambda: TrimmedMean(beta=0.2),
    "Krum": lambda: Krum(num_malicious=1),
    "MultiKrum": lambda: Krum(num_malicious=1, to_keep=3),
}
"""The aggregators ``--robust`` compares (5 clients a round: trimmed mean cuts 1 from each end, Krum keeps 1 or 3)."""


def robust_run(spec: dict[str, Any], aggregator: Any, *, scale: float | None) -> float:
    """The final test accuracy of ``spec`` under ``aggregator``, with a :class:`ScalesUpdate` client when ``scale``."""
    faulty = [ScalesUpdate(scale)] if scale is not None else []
    loop_spec = {**spec["loop"], "aggregator": aggregator, "client_transforms": faulty, "callbacks": faulty}
    with scratch_loop({**spec, "loop": loop_spec}) as loop:
        return float(loop.fit()["test_accuracy"])


SPEC = {
    "seed": 0,
    "data": {"dataset": "digits", "num_clients": 4, "partition": "iid", "image_size": 16, "batch_size": 32},
    "model": {"class_path": "lightning_fl.models.ImageClassifier", "init_args": {"backbone": "lenet_dlg", "lr": 2e-3}},
    "loop": {"num_rounds": 3, "clients_per_round": 4, "local_steps": 20, "eval_every": 3},
}
"""The federation every line runs (the shared builder's spec); each line adds its faulty client."""


def _run(label: str, *, defences: tuple = (), **options: Any) -> None:
    with scratch_loop({**SPEC, "defences": list(defences), "loop": {**SPEC["loop"], **options}}) as loop:
        try:
            summary = loop.fit()
        except (RuntimeError, ValueError) as err:
            print(f"{label}: the run stopped: {type(err).__name__}: {str(err)[:100]}")
            return
    largest = max(v.abs().max().item() for v in loop.global_model.state_dict().values())
    clients = summary["history"][0]["clients"]
    print(f"{label}: max |w| {largest:.3g}, accuracy {summary['test_accuracy']:.4f}, round 0 aggregated {clients}")


def robust_table(*, scale: float, rounds: int | None, only: list[str] | None) -> None:
    """One markdown row per aggregator: honest accuracy, accuracy with the faulty client, and the wall time."""
    spec = quickstart_spec()
    if rounds is not None:
        spec["loop"]["num_rounds"] = rounds
    print(f"| aggregator | honest | client x{scale:g} | seconds |")
    print("|---|---|---|---|")
    for name, make in ROBUST.items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        honest = robust_run(spec, make(), scale=None)
        attacked = robust_run(spec, make(), scale=scale)
        print(f"| {name} | {honest:.4f} | {attacked:.4f} | {time.perf_counter() - start:.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--robust", action="store_true", help="the quickstart under each robust aggregator")
    parser.add_argument("--scale", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    if args.robust:
        robust_table(scale=args.scale, rounds=args.rounds, only=args.only)
        return
    encryption = _ScalesClearLayers(key_size=512, layers=["backbone.fc.bias"], max_weight_sum=2**12)
    _run("paillier clear x1e20", defences=[encryption], aggregator=SecureFedAvg())
    for num_samples in (324, 1, 1e12, math.inf):
        _run(f"num_samples={num_samples:g}", client_transforms=[_ClaimsSamples(num_samples)])


if __name__ == "__main__":
    main()
