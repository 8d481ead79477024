"""``loop.workers``: clients trained in worker processes give the history of ``workers=1``, bit for bit."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_fl import FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import KeyLocks
from lightning_fl.private import public_state
from tests.conftest import make_classifier, three_keylock_clients


def _run(tmp_path, workers: int, backend: str = "processes") -> FederatedLoop:
    dm = FederatedDataModule("digits", num_clients=4, partition="dirichlet", alpha=0.5, image_size=16, seed=0)
    torch.manual_seed(0)
    loop = FederatedLoop(
        make_classifier(dm),
        dm,
        num_rounds=2,
        clients_per_round=3,
        local_steps=3,
        defences=[KeyLocks(key_length=16)],
        output_dir=tmp_path / f"{backend}{workers}",
        checkpoint=False,
        progress_bar=False,
        workers=workers,
        backend=backend,
    )
    loop.fit()
    return loop


@pytest.mark.parametrize("backend", ["processes", "ray"])  # ray: ~35 s under load, most of it starting Ray
def test_two_workers_give_the_same_history_state_and_client_secrets_as_one(tmp_path, backend) -> None:
    if backend == "ray":
        pytest.importorskip("ray", reason="the ray extra is not installed")
    torch.set_num_threads(1)  # the same number of threads in every process: bit-identical arithmetic
    one, two = _run(tmp_path, 1), _run(tmp_path, 2, backend)
    assert two.history == one.history  # losses and accuracies, exactly
    for key, value in public_state(one.global_model).items():
        assert torch.equal(public_state(two.global_model)[key], value), key
    trained = [c for c in one.clients if c.initialised]
    assert trained and [c.client_id for c in trained] == [c.client_id for c in two.clients if c.initialised]
    for mine, theirs in zip(trained, (two.clients[c.client_id] for c in trained), strict=True):
        assert mine.private.keys() == theirs.private.keys()
        assert all(torch.equal(mine.private[k], theirs.private[k]) for k in mine.private)
    assert "pool" not in vars(two.client_step)  # the fit's pool is an argument of its rounds, never kept by a step


@pytest.mark.parametrize(
    ("workers", "options", "field"),
    [
        (0, {}, "loop.workers=0"),
        (2, {"backend": "dask"}, "loop.backend='dask'"),
        (2, {"trainer": {"accelerator": "gpu"}}, "loop.trainer"),
        (2, {"client_callbacks": [L.Callback()]}, "client Trainer callbacks"),
    ],
)
def test_settings_workers_cannot_run_fail_before_training(tmp_path, workers, options, field) -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16)
    with pytest.raises(ValueError, match=field):
        FederatedLoop(make_classifier(dm), dm, workers=workers, output_dir=tmp_path, **options)


class _PowerLoss(torch.utils.data.Dataset):
    """Client 1's data source on a device that loses power while training reads it."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        raise RuntimeError("client 1 lost power")


def _three_clients_in_two_workers(tmp_path) -> FederatedLoop:
    return three_keylock_clients(tmp_path, eval_every=0, workers=2)


def test_a_client_failing_in_a_worker_is_dropped_and_keeps_no_secrets(tmp_path) -> None:
    loop = _three_clients_in_two_workers(tmp_path)
    loaders = loop.runner.datamodule.train_dataloader

    def client_1_fails_while_training(client_id, **kwargs):
        if client_id == 1:
            return torch.utils.data.DataLoader(_PowerLoss(), batch_size=2)
        return loaders(client_id, **kwargs)

    loop.runner.datamodule.train_dataloader = client_1_fails_while_training  # the forked workers inherit it
    with pytest.warns(UserWarning, match="client 1 failed and is dropped.*client 1 lost power"):
        loop.fit()
    assert loop.history[0]["clients"] == [0, 2]
    assert [c.initialised for c in loop.clients] == [True, False, True]


def test_a_fault_of_our_own_code_in_a_worker_stops_the_run(tmp_path) -> None:
    loop = _three_clients_in_two_workers(tmp_path)

    def broken_load(ctx, received) -> None:  # our code around the fit, not the client's work
        raise TypeError("load_state_into() got an unexpected keyword argument 'strict'")

    loop.runner.load_client = broken_load
    with pytest.raises(RuntimeError, match=r"(?s)in worker process: .*TypeError: load_state_into"):
        loop.fit()
