"""The contexts keep their word: a plug-in changes the global model only through what it returns, a callback
changes a client's own state only through ``FederationView.set_client_extra``."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from lightning_fl import FederatedCallback, SetupContext
from lightning_fl.contexts import ClientSetupContext
from lightning_fl.private import public_state
from lightning_fl.server import FedAvg, UniformSelector
from tests.conftest import three_keylock_clients
from tests.federation.test_round import fail_client_1


class Vandal(FedAvg):
    """FedAvg that also writes into every tensor of the round context's global state."""

    def aggregate(self, updates, *, ctx):
        for tensor in ctx.global_state.values():
            if tensor.is_floating_point():
                tensor.add_(100.0)
        return super().aggregate(updates, ctx=ctx)


class Tamperer(FederatedCallback):
    """Writes into every client state it can read, and through the one method that may change it."""

    def __init__(self, *, documented: bool) -> None:
        self.documented = documented

    def on_client_fit_end(self, federation, update) -> None:
        client = federation.clients[update.client_id]
        for tensor in client.private.values():
            tensor.add_(1.0)
        client.private["stolen"] = torch.zeros(1)
        client.extra["note"] = "forged"
        with torch.no_grad():
            for parameter in federation.global_model.parameters():
                parameter.zero_()
        if self.documented:
            federation.set_client_extra(update.client_id, "note", {"steps": 1})


def _fitted(output_dir, **options):
    torch.manual_seed(0)  # the same initial global model in every run
    loop = three_keylock_clients(output_dir, eval_every=0, **options)
    loop.fit()
    return loop


def _final_state(loop) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in public_state(loop.global_model).items()}


def test_an_aggregator_changes_the_global_model_only_through_its_return_value(tmp_path) -> None:
    plain, vandal = _fitted(tmp_path / "plain"), _fitted(tmp_path / "vandal", aggregator=Vandal())
    for key, value in _final_state(plain).items():
        assert torch.equal(_final_state(vandal)[key], value), key


def test_a_callback_changes_client_state_only_through_set_client_extra(tmp_path) -> None:
    plain = _fitted(tmp_path / "plain")
    reads = _fitted(tmp_path / "reads", callbacks=[Tamperer(documented=False)])
    writes = _fitted(tmp_path / "writes", callbacks=[Tamperer(documented=True)])
    for ours, theirs, written in zip(plain.clients, reads.clients, writes.clients, strict=True):
        assert ours.private and ours.private.keys() == theirs.private.keys() == written.private.keys()
        assert all(torch.equal(ours.private[k], theirs.private[k]) for k in ours.private)
        assert theirs.extra == {} and written.extra == {"note": {"steps": 1}}
    for key, value in _final_state(plain).items():
        assert torch.equal(_final_state(reads)[key], value), key


def test_the_server_side_setup_context_carries_no_client_state() -> None:
    fields = {f.name for f in dataclasses.fields(SetupContext)}
    assert "clients" not in fields and fields >= {"spec", "test_set", "global_model", "aggregator"}
    assert {f.name for f in dataclasses.fields(ClientSetupContext)} == {"spec", "clients", "val_sets"}


def _reachable(root: object, depth: int = 6) -> list[object]:
    """Every object a plug-in reaches from ``root`` through public attributes, dataclass fields, containers and bound
    methods (what it may touch without reaching into private names)."""
    seen: dict[int, object] = {}
    frontier = [root]
    for _ in range(depth):
        found = []
        for obj in frontier:
            if id(obj) in seen or isinstance(obj, str | bytes | int | float | torch.Tensor | type):
                continue
            seen[id(obj)] = obj
            if isinstance(obj, dict):
                found += list(obj.values())
            elif isinstance(obj, list | tuple | set | frozenset):
                found += list(obj)
            elif inspect.ismethod(obj):
                found.append(obj.__self__)
            elif dataclasses.is_dataclass(obj):
                found += [getattr(obj, f.name) for f in dataclasses.fields(obj)]
            elif hasattr(obj, "__dict__"):
                found += [v for k, v in vars(obj).items() if not k.startswith("_")]
        frontier = found
    return list(seen.values())


def test_a_server_side_setup_plug_in_cannot_reach_any_client_data(tmp_path) -> None:
    loop = three_keylock_clients(tmp_path)
    dm = loop.datamodule
    client_data = [
        dm,
        dm.train_set,
        *(dm.client_train_set(k) for k in range(3)),
        *(dm.client_val_set(k) for k in range(3)),
    ]
    server_side = _reachable(loop.setup_context())
    assert not [type(d).__name__ for d in client_data if any(d is obj for obj in server_side)]
    assert any(dm.test_set is obj for obj in server_side)  # what the server holds is there
    client_side = _reachable(loop.client_setup_context())
    assert all(any(dm.client_val_set(k) is obj for obj in client_side) for k in range(3))  # the walk finds data


def test_the_setup_context_holds_a_copy_of_the_global_model(tmp_path) -> None:
    loop = three_keylock_clients(tmp_path)
    setup = loop.setup_context()
    with torch.no_grad():
        next(setup.global_model.parameters()).add_(1.0)
    first = next(loop.global_model.parameters())
    assert torch.equal(first, next(loop.view.global_model.parameters()))
    assert not torch.equal(next(setup.global_model.parameters()), first)


@pytest.mark.parametrize("index", [0, slice(0, 2)])
def test_client_states_read_through_the_view_are_copies(tmp_path, index) -> None:
    loop = three_keylock_clients(tmp_path)
    loop.fit()
    read = loop.view.clients[index]
    for client in read if isinstance(read, list) else [read]:
        for tensor in client.private.values():
            tensor.zero_()
    assert all(any(t.abs().sum() > 0 for t in c.private.values()) for c in loop.clients)


def test_the_view_tells_which_callbacks_run_but_hands_none_out(tmp_path) -> None:
    tamperer = Tamperer(documented=False)
    loop = three_keylock_clients(tmp_path, callbacks=[tamperer])
    held = loop.view.callbacks
    assert tamperer in held and Tamperer(documented=False) not in held and held.names == ("Tamperer",)
    for value in vars(held).values():  # identities and names only: nothing leads back to the callback
        assert all(
            not isinstance(v, FederatedCallback) for v in (value if isinstance(value, tuple | frozenset) else [value])
        )
    assert len(loop.view.client_callbacks) == len(loop.client_callbacks)


def test_the_steps_run_on_their_own_and_return_what_changed(tmp_path, monkeypatch) -> None:
    loop = three_keylock_clients(tmp_path)
    fail_client_1(loop, monkeypatch)
    before = _final_state(loop)
    ctx = loop.round_context()
    with pytest.warns(UserWarning, match="client 1 failed"):
        clients = loop.client_step.run(ctx, [0, 1, 2], loop.view)
    assert [u.client_id for u in clients.updates] == [0, 2] and clients.failures == {1: "failed (lost power)"}
    server = loop.server_step.run(ctx, clients, global_state=_final_state(loop), federation=loop.view)
    assert all(torch.equal(v, before[k]) for k, v in _final_state(loop).items())  # the steps wrote no model
    assert set(server.global_state) == set(loop.spec.update_keys)
    assert any(not torch.equal(server.global_state[k], before[k]) for k in server.global_state)


class Scribbler(UniformSelector):
    """Selects uniformly, after writing into every tensor of the global state its context holds."""

    def select(self, ctx):
        for tensor in ctx.global_state.values():
            if tensor.is_floating_point():
                tensor.add_(100.0)
        return super().select(ctx)


class Witness(FedAvg):
    """FedAvg that keeps the global state its context shows it."""

    def aggregate(self, updates, *, ctx):
        self.seen = {k: v.clone() for k, v in ctx.global_state.items()}
        return super().aggregate(updates, ctx=ctx)


class Zeroer(FederatedCallback):
    """Zeroes, in place, every tensor of each update it is shown at the end of a client fit."""

    def on_client_fit_end(self, federation, update) -> None:
        for tensor in update.delta.values():
            tensor.zero_()


def test_a_plug_in_writing_into_its_context_changes_nothing_another_plug_in_sees(tmp_path) -> None:
    torch.manual_seed(0)
    witness = Witness()
    loop = three_keylock_clients(tmp_path, eval_every=0, selector=Scribbler(), aggregator=witness)
    before = _final_state(loop)
    loop.fit()
    assert witness.seen.keys() == before.keys()
    assert all(torch.equal(witness.seen[k], v) for k, v in before.items())  # not the selector's +100


def test_a_callback_writing_into_the_update_it_is_shown_changes_no_aggregate(tmp_path) -> None:
    plain, zeroed = _fitted(tmp_path / "plain"), _fitted(tmp_path / "zeroed", callbacks=[Zeroer()])
    for key, value in _final_state(plain).items():
        assert torch.equal(_final_state(zeroed)[key], value), key
