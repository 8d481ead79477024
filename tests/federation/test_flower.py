"""The Flower adapter: the same federation in Flower's simulation gives FederatedLoop's history for the same seed.

Both runs train the same clients with the same seeds from ``(seed, round, client)`` on one torch thread per
process, and the updates cross Flower as exact float32 arrays, so the history is compared exactly: losses,
accuracies, selected clients and sample counts per round, and every global tensor.
"""

from __future__ import annotations

import re
import sys

import lightning as L
import pytest
import torch

from lightning_fl import FederatedLoop, FlowerFederation
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import GaussianNoise, KeyLocks, PaillierEncryption
from lightning_fl.flower import check_flower
from lightning_fl.private import public_state
from tests.conftest import make_classifier, three_keylock_clients

pytest.importorskip("flwr", reason="the flower extra is not installed")


def build(output_dir: str = "runs/flower-test") -> FederatedLoop:
    """4 clients of 16x16 digits, 3 a round, KeyLocks (private state on the clients), client-side Gaussian noise."""
    dm = FederatedDataModule("digits", num_clients=4, partition="dirichlet", alpha=0.5, image_size=16, seed=0)
    torch.manual_seed(0)
    return FederatedLoop(
        make_classifier(dm),
        dm,
        num_rounds=2,
        clients_per_round=3,
        local_steps=3,
        defences=[KeyLocks(key_length=16), GaussianNoise(0.01)],
        output_dir=output_dir,
        checkpoint=False,
        progress_bar=False,
    )


def test_flower_simulation_gives_the_history_of_the_federated_loop(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the ClientApp actors build the loop too; nothing may be written there
    torch.set_num_threads(1)
    reference = build(str(tmp_path / "loop"))
    reference.fit()

    federation = FlowerFederation(build)
    one_actor = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": 1}}
    summary = federation.run_simulation(backend_config=one_actor)  # one ClientApp process: cheapest on CI's 2 cores

    flower = federation.loop
    assert summary["history"] == reference.history
    assert [e["clients"] for e in flower.history] == [e["clients"] for e in reference.history]
    for key, value in public_state(reference.global_model).items():
        assert torch.equal(public_state(flower.global_model)[key], value), key
    assert not any(c.initialised for c in flower.clients)  # no client's key-lock secrets on the server
    assert not list(tmp_path.glob("runs/flower-test/clients/*"))


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"eval_on": "clients"}, "loop.eval_on='clients'"),
        ({"client_callbacks": [L.Callback()]}, "client Trainer callbacks"),
        ({"workers": 2}, "loop.workers"),
        ({"client_transforms": [PaillierEncryption(key_size=512)]}, "PaillierEncryption"),
    ],
)
def test_settings_flower_cannot_run_fail_before_training(tmp_path, options, field) -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16)
    loop = FederatedLoop(make_classifier(dm), dm, output_dir=tmp_path, **options)
    with pytest.raises(ValueError, match=re.escape(field)):
        check_flower(loop)


def test_without_flower_the_error_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "flwr", None)
    with pytest.raises(ImportError, match=re.escape("pip install 'lightning-fl[flower]'")):
        FlowerFederation(build)


class InProcessGrid:
    """A Flower ``Grid`` stand-in that runs the ClientApp in this process, one node per client (no Ray, seconds):
    what Flower's engines do, minus transport; a raising ClientApp becomes an error reply, as in Flower."""

    def __init__(self, client_app, num_clients: int) -> None:
        from flwr.app import Context, RecordDict

        self.client_app = client_app
        self.contexts = {
            100 + k: Context(1, 100 + k, node_config={"partition-id": k}, state=RecordDict(), run_config={})
            for k in range(num_clients)
        }

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None) -> list:
        from flwr.app import Error, Message

        replies = []
        for message in messages:
            try:
                replies.append(self.client_app(message, self.contexts[message.metadata.dst_node_id]))
            except Exception as err:
                replies.append(Message(Error(code=0, reason=repr(err)), reply_to=message))
        return replies


def one_round(output_dir: str = "runs/flower-test") -> FederatedLoop:
    return three_keylock_clients(output_dir)


@pytest.fixture
def server_app_identity(monkeypatch) -> None:
    """What Flower's engines set in the ServerApp's process, so its grid can be driven in this one."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_task_id", "_run_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)


@pytest.mark.usefixtures("server_app_identity")
def test_a_failing_client_is_dropped_and_secrets_stay_in_the_nodes_flower_state(tmp_path, monkeypatch) -> None:
    from flwr.app import Context, RecordDict

    from lightning_fl import flower

    monkeypatch.chdir(tmp_path)
    federation = FlowerFederation(one_round)
    client_loop = flower._client_loop(one_round, federation.key)  # what this process's ClientApp trains with
    fit = client_loop.runner.fit

    def fails_for_client_1(ctx, received, **kwargs):
        if ctx.client_id == 1:
            raise RuntimeError("client 1 lost power")
        return fit(ctx, received, **kwargs)

    monkeypatch.setattr(client_loop.runner, "fit", fails_for_client_1)
    grid = InProcessGrid(federation.client_app, 3)
    with pytest.warns(UserWarning, match="client 1 failed and is dropped.*client 1 lost power"):
        federation.server_app(grid, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={}))
    assert federation.summary["history"][0]["clients"] == [0, 2]
    stored = {ctx.node_config["partition-id"]: flower._STATE_KEY in ctx.state for ctx in grid.contexts.values()}
    assert stored == {0: True, 1: False, 2: True}  # each trained client's key-lock secrets, on its own node only
    assert not any(c.initialised for c in federation.loop.clients)
    assert not any(c.private for c in client_loop.runner.store)  # the ClientApp process forgets them after a fit


@pytest.mark.usefixtures("server_app_identity")
def test_supernodes_that_do_not_answer_in_time_are_named_with_the_timeout_to_raise() -> None:
    """A loaded machine can leave a ClientApp still building its loop when the query times out: the error says
    how many answered and which knob to raise, not that no node holds the clients."""
    from lightning_fl.flower import discover_nodes

    class SilentGrid(InProcessGrid):
        def send_and_receive(self, messages, *, timeout=None) -> list:
            return []

    with pytest.raises(RuntimeError, match=re.escape("only 0 of 2 Flower SuperNodes answered in 1.0 s; raise")):
        discover_nodes(SilentGrid(None, 2), 2, timeout=1.0)
