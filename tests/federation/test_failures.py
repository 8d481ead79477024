"""Which errors a round survives: a client's own failing work is dropped; our own faults and interrupts propagate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_fl import ClientUpdate, FederatedCallback, FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.federation.failures import ClientFailure, ServerSideError
from lightning_fl.models import ImageClassifier
from lightning_fl.server import ClientSelector, FedAvg
from lightning_fl.transforms import ClientTransform
from tests.conftest import make_classifier


class _Current(FederatedCallback):
    """The client being trained, as the test's stand-in for "which device am I"."""

    client: int | None = None

    def on_client_fit_start(self, loop, client_id: int) -> None:
        type(self).client = client_id


class _CrashesOnClient1(ImageClassifier):
    """A user's model whose training step raises on client 1's device after one successful step."""

    def training_step(self, batch, batch_idx: int):
        if _Current.client == 1 and batch_idx == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().training_step(batch, batch_idx)


class _Only(ClientSelector):
    def __init__(self, clients: list[int]) -> None:
        self.clients = clients

    def select(self, ctx) -> list[int]:
        return list(self.clients)


def _loop(tmp_path: Path, model_type: type = ImageClassifier, **kwargs) -> FederatedLoop:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16, batch_size=32, seed=0)
    torch.manual_seed(0)
    model = make_classifier(dm) if model_type is ImageClassifier else model_type(**dm.model_options, lr=2e-3)
    options = {
        "num_rounds": 1,
        "clients_per_round": 2,
        "local_steps": 3,
        "eval_every": 0,
        "callbacks": [_Current()],
        "output_dir": tmp_path,
        "checkpoint": False,
        "progress_bar": False,
        **kwargs,
    }
    return FederatedLoop(model, dm, **options)


def test_a_client_whose_training_raises_is_dropped_and_leaves_no_trace_in_the_global_model(tmp_path) -> None:
    failing = _loop(tmp_path / "a", _CrashesOnClient1)
    with pytest.warns(UserWarning, match=r"round 0: client 1 failed and is dropped \(RuntimeError\('CUDA error"):
        failing.fit()
    assert failing.history[0]["clients"] == [0]
    alone = _loop(tmp_path / "b", _CrashesOnClient1, selector=_Only([0]))  # the same round without client 1
    alone.fit()
    expected = alone.global_model.state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in failing.global_model.state_dict().items())
    assert not failing.clients[1].initialised


def test_when_every_client_fails_the_round_stops_and_the_global_model_is_untouched(tmp_path) -> None:
    loop = _loop(tmp_path, _CrashesOnClient1, selector=_Only([1]))
    before = {k: v.clone() for k, v in loop.global_model.state_dict().items()}
    with pytest.warns(UserWarning, match="client 1 failed"), pytest.raises(RuntimeError, match="only 0 valid"):
        loop.fit()
    assert all(torch.equal(before[k], v) for k, v in loop.global_model.state_dict().items())


class _BrokenFitEnd(FederatedCallback):
    def on_client_fit_end(self, loop, update: ClientUpdate) -> None:
        raise KeyError("num_samples")  # a bug in a server-side callback


class _BrokenAggregator(FedAvg):
    def aggregate(self, updates, *, ctx):
        return super().aggregate(updates, ctx=ctx)[0]  # a bug: forgets the metrics


class _BrokenListener(FederatedCallback):
    def on_local_gradient(self, loop, view, truth) -> None:
        raise AttributeError("'ServerView' object has no attribute 'gradient'")


class _Interrupted(ClientTransform):
    def __call__(self, update: ClientUpdate, *, ctx) -> ClientUpdate:
        raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"callbacks": [_BrokenFitEnd()]}, KeyError, "num_samples"),
        ({"aggregator": _BrokenAggregator()}, ValueError, "unpack"),
        ({"callbacks": [_BrokenListener()]}, ServerSideError, "local-gradient leak point failed in client 0's fit"),
        ({"client_transforms": [_Interrupted()]}, KeyboardInterrupt, None),
    ],
    ids=["fl-callback", "aggregator", "leak-point-listener-inside-the-fit", "keyboard-interrupt"],
)
def test_faults_of_server_components_and_interrupts_propagate(tmp_path, options, error, match) -> None:
    loop = _loop(tmp_path, **options)
    with pytest.raises(error, match=match):
        loop.fit()


def test_a_fault_in_our_own_code_around_the_fit_propagates(tmp_path, monkeypatch) -> None:
    loop = _loop(tmp_path)

    def broken_load(ctx, received) -> None:
        raise TypeError("load_state_into() got an unexpected keyword argument 'strict'")

    monkeypatch.setattr(loop.runner, "load_client", broken_load)
    with pytest.raises(TypeError, match="unexpected keyword"):
        loop.fit()


def test_a_client_failure_names_the_client_and_the_stage_and_keeps_the_cause() -> None:
    from lightning_fl.federation.failures import client_work

    expected = r"client 2 failed in training: OSError\('disk full'\)"
    with pytest.raises(ClientFailure, match=expected) as raised, client_work(2, "training"):
        raise OSError("disk full")
    assert isinstance(raised.value.__cause__, OSError) and raised.value.client_id == 2
