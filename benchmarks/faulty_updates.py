"""What one faulty client does to a federation: FedAvg of the sigmoid LeNet on digits, 4 IID clients, all selected
every round, 3 rounds of 20 local steps, client 1 faulty in one way per line:

* ``paillier clear x1e20``: Paillier secure aggregation (512-bit key) of ``backbone.fc.bias``, the other layers sent
  in the clear; client 1 multiplies its clear layers by 1e20 after encrypting (a malicious client's encoder);
* ``num_samples=<n>``: client 1 reports ``n`` training samples (it holds 324), the FedAvg weight of its update.

Each line prints the largest absolute global weight, the test accuracy after round 3 and the clients aggregated in
round 0 (or why the run stopped). docs/architecture.md ("Checkpoints and resume", update checks) holds the results.

    .venv/bin/python benchmarks/faulty_updates.py
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from lightning_fl import ClientUpdate, scratch_loop
from lightning_fl.defences import PaillierEncryption, SecureFedAvg
from lightning_fl.transforms import ClientTransform


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


def main() -> None:
    encryption = _ScalesClearLayers(key_size=512, layers=["backbone.fc.bias"], max_weight_sum=2**12)
    _run("paillier clear x1e20", defences=[encryption], aggregator=SecureFedAvg())
    for num_samples in (324, 1, 1e12, math.inf):
        _run(f"num_samples={num_samples:g}", client_transforms=[_ClaimsSamples(num_samples)])


if __name__ == "__main__":
    main()
