from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from lightning_fl import (
    BroadcastTransform,
    ClientTransform,
    ClientUpdate,
    FederatedCallback,
    FederatedLoop,
    mark_private,
    private_state,
)
from lightning_fl.datamodules import FederatedDataModule
from tests.conftest import make_classifier


def _loop(dm, tmp_path, model=None, **kwargs) -> FederatedLoop:
    options = {
        "num_rounds": 2,
        "clients_per_round": 2,
        "local_epochs": 1,
        "progress_bar": False,
        "output_dir": tmp_path,
        **kwargs,
    }
    return FederatedLoop(model or make_classifier(dm), dm, **options)


def test_one_client_one_step_equals_one_centralised_sgd_step(tmp_path) -> None:
    dm = FederatedDataModule("digits", num_clients=1, partition="iid", image_size=16, batch_size=4096, val_fraction=0)
    model = make_classifier(dm, optimizer="sgd", lr=0.5)
    reference = copy.deepcopy(model)
    loop = _loop(dm, tmp_path, model, num_rounds=1, clients_per_round=1, local_steps=1, eval_every=0)
    loop.fit()
    images, labels = dm.client_train_set(0).tensors()
    loss = F.cross_entropy(reference(images), labels)
    grads = torch.autograd.grad(loss, list(reference.parameters()))
    for (name, p), g in zip(reference.named_parameters(), grads, strict=True):
        assert torch.allclose(model.state_dict()[name], p - 0.5 * g, atol=1e-6), name


def test_quickstart_run_passes_ninety_percent_on_digits(tmp_path) -> None:
    dm = FederatedDataModule("digits", num_clients=10, partition="dirichlet", alpha=0.5)
    loop = _loop(dm, tmp_path, num_rounds=20, clients_per_round=5, local_epochs=3, eval_every=5)
    summary = loop.fit()
    assert summary["test_accuracy"] >= 0.90
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["rounds_completed"] == 20 and written["attacks"] == []
    assert {"round", "train_loss", "test_accuracy"} <= set(written["history"][-1])


def _private_model(dm: FederatedDataModule):
    model = make_classifier(dm)
    mark_private(model.backbone.body[0])  # the first convolution stays on each client
    return model


def test_resumed_run_ends_with_the_same_weights(tiny_digits, tmp_path) -> None:
    torch.manual_seed(0)
    full = _loop(tiny_digits, tmp_path / "full", _private_model(tiny_digits), num_rounds=3)
    full.fit()
    torch.manual_seed(0)
    first = _loop(tiny_digits, tmp_path / "cut", _private_model(tiny_digits), num_rounds=2)
    first.fit()
    torch.manual_seed(123)  # a different process state: everything must come from the checkpoint
    resumed = _loop(tiny_digits, tmp_path / "cut", _private_model(tiny_digits), num_rounds=3)
    resumed.fit(resume=True)
    assert resumed.round_idx == 3 and len(resumed.history) == 3
    for key, value in full.global_model.state_dict().items():
        if key.startswith("backbone.body.0"):
            continue  # private: compared per client below
        assert torch.equal(value, resumed.global_model.state_dict()[key]), key
    for a, b in zip(full.clients, resumed.clients, strict=True):
        assert a.private.keys() == b.private.keys()
        assert all(torch.equal(a.private[k], b.private[k]) for k in a.private)


class _Recorder(FederatedCallback):
    def __init__(self) -> None:
        self.updates, self.views, self.gradient_views = [], [], []

    def on_client_fit_end(self, loop, update) -> None:
        self.updates.append(update)

    def on_client_update(self, loop, view, ground_truth) -> None:
        self.views.append((view, ground_truth))

    def on_local_gradient(self, loop, view, ground_truth) -> None:
        self.gradient_views.append((view, ground_truth))


def test_private_tensors_never_leave_the_client(tiny_digits, tmp_path) -> None:
    model = _private_model(tiny_digits)
    server_guess = {k: v.clone() for k, v in private_state(model).items()}
    recorder = _Recorder()
    loop = _loop(tiny_digits, tmp_path, model, callbacks=[recorder], num_rounds=2)
    loop.fit()
    private_keys = set(server_guess)
    assert private_keys == {"backbone.body.0.weight", "backbone.body.0.bias"}
    assert all(private_keys.isdisjoint(u.delta) for u in recorder.updates)
    server_ckpt = torch.load(loop.checkpoint.server_path, weights_only=True)
    assert private_keys.isdisjoint(server_ckpt["global_state"])
    assert "backbone.body.0" not in json.dumps(json.loads((tmp_path / "summary.json").read_text()))
    for view, _ in recorder.views + recorder.gradient_views:
        assert private_keys.isdisjoint(view.tensors)
        for key in private_keys:  # the attacker's model holds the server's own guess, not the client's secret
            assert torch.equal(view.model.state_dict()[key], server_guess[key])
    trained = [c for c in loop.clients if c.initialised]
    assert trained and all(
        not torch.equal(c.private["backbone.body.0.weight"], server_guess["backbone.body.0.weight"]) for c in trained
    )


def test_leak_points_hand_ground_truth_apart_from_the_view(tiny_digits, tmp_path) -> None:
    recorder = _Recorder()
    loop = _loop(tiny_digits, tmp_path, callbacks=[recorder], num_rounds=1, local_steps=2)
    loop.fit()
    assert len(recorder.views) == 2 and len(recorder.gradient_views) == 4  # 2 clients x 2 local steps
    view, truth = recorder.gradient_views[0]
    assert view.kind == "gradient" and view.leak_point == "local_gradient"
    assert set(view.tensors) == {n for n, _ in view.model.named_parameters()}
    assert truth.inputs.shape[0] == view.metadata["batch_size"] == 32
    update_view, update_truth = recorder.views[0]
    assert update_view.metadata["local_steps"] == 2 and update_view.metadata["lr"] == 2e-3
    client = update_view.metadata["client_id"]
    assert update_truth.inputs.shape[0] == 2 * 32 < tiny_digits.num_train_samples(client)  # the 2 steps' batches


class _Saboteur(ClientTransform):
    """Client 1 sends NaNs, client 2 a wrong shape, client 3 crashes."""

    def __call__(self, update: ClientUpdate, *, ctx) -> ClientUpdate:
        if update.client_id == 3:
            raise RuntimeError("disk full")
        delta = dict(update.delta)
        key = next(iter(delta))
        if update.client_id == 1:
            delta[key] = torch.full_like(delta[key], float("nan"))
        if update.client_id == 2:
            delta[key] = torch.zeros(3)
        return ClientUpdate(update.client_id, update.round_idx, delta, update.num_samples, update.loss)


def test_faulty_clients_are_dropped_and_never_reach_the_global_model(tiny_digits, tmp_path) -> None:
    loop = _loop(tiny_digits, tmp_path, client_transforms=[_Saboteur()], num_rounds=1, clients_per_round=4)
    with pytest.warns(UserWarning) as record:
        loop.fit()
    messages = " ".join(str(w.message) for w in record)
    assert "client 1 is dropped" in messages and "non-finite" in messages
    assert "client 2 is dropped" in messages and "shape" in messages
    assert "client 3 failed" in messages and "disk full" in messages
    assert loop.history[0]["clients"] == [0]
    assert all(torch.isfinite(v).all() for v in loop.global_model.state_dict().values())


def test_round_fails_clearly_below_min_clients(tiny_digits, tmp_path) -> None:
    loop = _loop(
        tiny_digits, tmp_path, client_transforms=[_Saboteur()], num_rounds=1, clients_per_round=4, min_clients=2
    )
    before = {k: v.clone() for k, v in loop.global_model.state_dict().items()}
    with (
        pytest.warns(UserWarning),
        pytest.raises(RuntimeError, match=r"only 1 valid client updates \(of 4 selected\) but loop.min_clients=2"),
    ):
        loop.fit()
    assert all(torch.equal(before[k], v) for k, v in loop.global_model.state_dict().items())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clients_per_round": 9}, "clients_per_round=9 exceeds data.num_clients=4"),
        ({"clients_per_round": 1.5}, "as a fraction must be in"),
        ({"num_rounds": -1}, "num_rounds=-1 must be >= 0"),
        ({"local_epochs": 0}, "local_epochs=0 must be >= 1"),
        ({"min_clients": 3}, "min_clients=3 must be between 1 and loop.clients_per_round"),
        ({"trainer": {"max_epochs": 3}}, "use loop.local_epochs"),
    ],
)
def test_loop_rejects_bad_settings(tiny_digits, tmp_path, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _loop(tiny_digits, tmp_path, **kwargs)


def test_fraction_of_clients_per_round(tiny_digits, tmp_path) -> None:
    assert _loop(tiny_digits, tmp_path, clients_per_round=0.5).clients_per_round == 2


def test_loggers_step_by_round_and_wandb_stays_offline(tiny_digits, tmp_path, monkeypatch) -> None:
    import csv

    monkeypatch.setenv("WANDB_MODE", "online")  # the loop's own default must still win: no network here
    loop = _loop(tiny_digits, tmp_path, num_rounds=2, wandb_project="lightning-fl-tests")
    loop.fit()
    rows = list(csv.DictReader((tmp_path / "logs" / "metrics.csv").open()))
    assert [int(r["round"]) for r in rows] == [0, 1] and all(r["test_accuracy"] for r in rows)
    assert list((tmp_path / "wandb").glob("offline-run-*"))


class _ShiftBias(BroadcastTransform):
    """Adds 1 to the classifier bias of the model sent to each client."""

    def __init__(self, persistent: bool) -> None:
        self.persistent = persistent

    def __call__(self, state, *, ctx):
        return {k: v + 1.0 if k == "backbone.fc.bias" else v for k, v in state.items()}


@pytest.mark.parametrize("persistent", [True, False])
def test_persistent_broadcast_averages_models_not_changes(tiny_digits, tmp_path, persistent: bool) -> None:
    recorder = _Recorder()
    loop = _loop(
        tiny_digits, tmp_path, broadcast_transforms=[_ShiftBias(persistent)], callbacks=[recorder], num_rounds=1
    )
    before = loop.global_model.state_dict()["backbone.fc.bias"].clone()
    loop.fit()
    weights = torch.tensor([float(u.num_samples) for u in recorder.updates])
    mean_delta = sum(
        w * u.delta["backbone.fc.bias"] for w, u in zip(weights / weights.sum(), recorder.updates, strict=True)
    )
    expected = before + mean_delta + (1.0 if persistent else 0.0)
    assert torch.allclose(loop.global_model.state_dict()["backbone.fc.bias"], expected, atol=1e-6)
