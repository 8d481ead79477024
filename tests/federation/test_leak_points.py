"""The type-0 leak point shows what is broadcast: the aggregate after the server transforms (server-side DP noise)."""

from __future__ import annotations

import pytest
import torch

from lightning_fl import FederatedCallback
from lightning_fl.attacks import DLGAttack
from lightning_fl.callbacks import GradientLeakage
from lightning_fl.defences import FedSDPServerNoise
from lightning_fl.private import public_state
from tests.conftest import one_step_attack_loop


class _Type0(FederatedCallback):
    def __init__(self) -> None:
        self.views = []

    def on_aggregate_end(self, loop, view, ground_truth) -> None:
        self.views.append(view)


def test_the_type_0_view_is_the_noised_delta_the_new_global_model_carries(tmp_path) -> None:
    seen = _Type0()
    loop = one_step_attack_loop(tmp_path, callbacks=[seen], defences=[FedSDPServerNoise(noise_multiplier=1.0)])
    loop.fit()
    (view,) = seen.views
    before, after = public_state(view.model), public_state(loop.global_model)
    assert set(view.tensors) == set(loop.spec.update_keys)
    for key, delta in view.tensors.items():
        assert torch.equal(before[key] + delta, after[key])  # exactly the broadcast step, noise included
    assert max(float(d.abs().max()) for d in view.tensors.values()) > 0.5  # noise std 1.0, not a 0.1-lr SGD step


@pytest.mark.parametrize(("noise", "recovered"), [(0.0, True), (1.0, False)])
def test_an_attack_on_the_type_0_view_sees_the_server_noise(tmp_path, noise: float, recovered: bool) -> None:
    attack = GradientLeakage(DLGAttack(max_iterations=300, restarts=4, progress_bar=False), leak_point="aggregate")
    defences = [FedSDPServerNoise(noise_multiplier=noise)] if noise else []
    entry = one_step_attack_loop(tmp_path, callbacks=[attack], defences=defences).fit()["attacks"][0]
    assert entry["leak_point"] == "aggregate"
    assert (entry["psnr"] >= 30) is recovered, entry["psnr"]


class _Truths(FederatedCallback):
    """Records the ground truth handed out at the type-2 and type-1 leak points, by client."""

    def __init__(self, *, local_gradient: bool) -> None:
        self.local_gradient, self.gradient_truths, self.update_truths = local_gradient, {}, {}

    def listens_to(self, hook: str) -> bool:
        return hook == "on_client_update" or (self.local_gradient and hook == "on_local_gradient")

    def on_local_gradient(self, loop, view, ground_truth) -> None:
        self.gradient_truths.setdefault(view.metadata["client_id"], []).append(ground_truth.inputs)

    def on_client_update(self, loop, view, ground_truth) -> None:
        self.update_truths[view.metadata["client_id"]] = ground_truth


def _truths(
    tmp_path, *, batch_size: int, local_steps: int, local_gradient: bool, vectorize: bool, workers: int = 1
) -> _Truths:
    from lightning_fl import FederatedDataModule, FederatedLoop
    from tests.conftest import make_classifier

    dm = FederatedDataModule("digits", num_clients=3, partition="iid", batch_size=batch_size, image_size=16)
    torch.manual_seed(0)
    truths = _Truths(local_gradient=local_gradient)
    FederatedLoop(
        make_classifier(dm, optimizer="sgd", lr=0.1), dm, num_rounds=1, clients_per_round=2, local_steps=local_steps,
        eval_every=0, callbacks=[truths], output_dir=tmp_path, checkpoint=False, progress_bar=False,
        vectorize=vectorize, workers=workers,
    ).fit()  # fmt: skip
    return truths


@pytest.mark.parametrize(("batch_size", "local_steps"), [(1, 1), (4, 2)])
def test_the_type_1_ground_truth_is_the_examples_the_local_steps_drew(tmp_path, batch_size, local_steps) -> None:
    """In every inner fit (the Trainer with the type-2 tap, Fabric, vectorised, worker processes) the update of a
    client that trained by local steps is scored against the batches those steps drew, not its whole training set."""
    tapped = _truths(
        tmp_path / "t", batch_size=batch_size, local_steps=local_steps, local_gradient=True, vectorize=False
    )
    fabric = _truths(
        tmp_path / "f", batch_size=batch_size, local_steps=local_steps, local_gradient=False, vectorize=False
    )
    stacked = _truths(
        tmp_path / "v", batch_size=batch_size, local_steps=local_steps, local_gradient=False, vectorize=True
    )
    workers = _truths(
        tmp_path / "w", batch_size=batch_size, local_steps=local_steps, local_gradient=False, vectorize=False, workers=2
    )
    assert len(tapped.update_truths) == 2
    for client, truth in tapped.update_truths.items():
        drawn = torch.cat(tapped.gradient_truths[client])
        assert drawn.shape[0] == batch_size * local_steps == len(truth.targets)
        assert torch.equal(truth.inputs, drawn)
        assert torch.equal(fabric.update_truths[client].inputs, drawn)
        assert torch.equal(stacked.update_truths[client].inputs, drawn)
        assert torch.equal(workers.update_truths[client].inputs, drawn)
        assert torch.equal(workers.update_truths[client].targets, truth.targets)


class _AggregateTruth(_Truths):
    """Records the ground truth handed out at the type-0 leak point (the aggregate), and at type 1 when asked."""

    def __init__(self, *, updates: bool) -> None:
        super().__init__(local_gradient=False)
        self.updates, self.aggregate_truths = updates, []

    def listens_to(self, hook: str) -> bool:
        return hook == "on_aggregate_end" or (self.updates and hook == "on_client_update")

    def on_aggregate_end(self, loop, view, ground_truth) -> None:
        self.aggregate_truths.append(ground_truth)


@pytest.mark.parametrize(("vectorize", "updates"), [(False, True), (True, True), (False, False)])
def test_the_type_0_ground_truth_is_the_examples_the_clients_local_steps_drew(tmp_path, vectorize, updates) -> None:
    """The aggregate of clients that trained by local steps is scored against the images behind it (what each
    client's steps drew, also when no callback listens at the clients' updates), not their whole training sets."""
    from lightning_fl import FederatedDataModule, FederatedLoop
    from tests.conftest import make_classifier

    dm = FederatedDataModule("digits", num_clients=3, partition="iid", batch_size=2, image_size=16)
    truths = _AggregateTruth(updates=updates)
    FederatedLoop(
        make_classifier(dm, optimizer="sgd", lr=0.1), dm, num_rounds=1, clients_per_round=3, local_steps=1,
        eval_every=0, callbacks=[truths], output_dir=tmp_path, checkpoint=False, progress_bar=False,
        vectorize=vectorize,
    ).fit()  # fmt: skip
    (truth,) = truths.aggregate_truths
    assert len(truth.targets) == 3 * 2  # 3 clients x one step of 2 images
    if updates:
        drawn = torch.cat([t.inputs for t in truths.update_truths.values()])
        assert sorted(map(tuple, truth.inputs.flatten(1).tolist())) == sorted(map(tuple, drawn.flatten(1).tolist()))
