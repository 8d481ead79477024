"""SecAgg masking on the full quickstart with 1 of 5 clients dropping out: the same global model as plain FedAvg.

Section "SecAgg by pairwise masking" of docs/secure_aggregation.md. Builds the federation of
``configs/quickstart.yaml`` (10 digits clients, Dirichlet 0.5, 5 a round, 3 local epochs of Adam 2e-3, 32x32 LeNet)
twice, once with ``SecAggMasking`` and once with plain FedAvg; in round ``--drop-round`` the last selected client's
device fails after the keys were shared. Prints the largest absolute difference between the two final global models,
their test accuracies and SecAgg's dropped count per round.

Run: ``OMP_NUM_THREADS=1 python benchmarks/secagg_dropout.py [--rounds 25] [--drop-round 3]``
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from lightning_fl import FederatedLoop, build_loop, fit_config_spec
from lightning_fl.callbacks import FederatedCallback
from lightning_fl.defences import SecAggMasking
from lightning_fl.models import ImageClassifier
from lightning_fl.private import public_state

QUICKSTART = Path(__file__).parents[1] / "configs" / "quickstart.yaml"


class Dropout(FederatedCallback):
    """Names the last client selected in round ``drop_round`` as the one whose device fails."""

    victim: int | None = None
    current: int | None = None

    def __init__(self, drop_round: int) -> None:
        self.drop_round = drop_round

    def on_round_start(self, loop, round_idx: int, selected: list[int]) -> None:
        type(self).victim = selected[-1] if round_idx == self.drop_round else None

    def on_client_fit_start(self, loop, client_id: int) -> None:
        type(self).current = client_id


class FlakyClassifier(ImageClassifier):
    """The quickstart's classifier, whose training step fails on the victim's device."""

    def training_step(self, batch, batch_idx: int):
        if Dropout.current == Dropout.victim:
            raise RuntimeError("device lost")
        return super().training_step(batch, batch_idx)


def fit(
    defences: list, rounds: int, drop_round: int, output: Path, *, image_size: int = 32, local_steps: int | None = None
) -> FederatedLoop:
    """The quickstart's federation (``local_steps`` instead of 3 local epochs when given), trained for ``rounds``."""
    spec = fit_config_spec(QUICKSTART, defences=defences)
    spec["data"] = {**spec["data"], "image_size": image_size}
    spec["model"] = {**spec["model"], "class_path": f"{__name__}.FlakyClassifier"}
    spec["loop"] = {**spec["loop"], "num_rounds": rounds, "local_steps": local_steps, "eval_every": rounds}
    spec["loop"]["vectorize"] = False  # the failure is raised in a client's own training_step: one Trainer each
    loop = build_loop(spec, output, callbacks=[Dropout(drop_round)])
    loop.fit()
    return loop


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--drop-round", type=int, default=3)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        secure = fit([SecAggMasking()], options.rounds, options.drop_round, Path(tmp) / "secagg")
        plain = fit([], options.rounds, options.drop_round, Path(tmp) / "fedavg")
    a, b = public_state(secure.global_model), public_state(plain.global_model)
    gap = max(float((a[k] - b[k]).abs().max()) for k in a)
    print(f"clients per round (SecAgg): {[len(h['clients']) for h in secure.history]}")
    print(f"dropped per round (SecAgg): {[int(h['secagg_dropped']) for h in secure.history]}")
    print(f"max |w_secagg - w_fedavg| = {gap:.2e}")
    accuracy = [loop.history[-1]["test_accuracy"] for loop in (secure, plain)]
    print(f"test accuracy: SecAgg {accuracy[0]:.4f}, FedAvg {accuracy[1]:.4f}")
