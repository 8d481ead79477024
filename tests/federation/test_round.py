"""A round is a function of values: ``Round.run(round_idx, global_state) -> RoundResult``, and the aggregator
receives the round's failures (as Flower's ``aggregate_fit(server_round, results, failures)``)."""

from __future__ import annotations

import pytest
import torch

from lightning_fl import ClientFailure
from lightning_fl.federation.round import RoundResult
from lightning_fl.private import public_state
from lightning_fl.server import FedAvg
from tests.conftest import three_keylock_clients


class FailureAware(FedAvg):
    """FedAvg that keeps the failures it was handed, as a Flower strategy receives them."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[int, str]] = []

    def aggregate(self, updates, *, ctx, failures=None):
        self.seen.append(dict(failures or {}))
        return super().aggregate(updates, ctx=ctx)


def fail_client_1(loop, monkeypatch) -> None:
    """Make client 1's local fit raise its own ``ClientFailure`` (it lost power)."""
    fit = loop.runner.fit

    def fit_or_fail(ctx, received, **kwargs):
        if ctx.client_id == 1:
            raise ClientFailure(1, "training", "lost power")
        return fit(ctx, received, **kwargs)

    monkeypatch.setattr(loop.runner, "fit", fit_or_fail)


@pytest.mark.parametrize("aggregator", [FailureAware(), FedAvg()], ids=["declares-failures", "without-failures"])
def test_a_round_returns_its_values_and_changes_no_model(tmp_path, monkeypatch, aggregator) -> None:
    loop = three_keylock_clients(tmp_path, aggregator=aggregator)
    fail_client_1(loop, monkeypatch)
    before = {k: v.clone() for k, v in public_state(loop.global_model).items()}
    one_round = loop.rounds.round
    with pytest.warns(UserWarning, match="client 1 failed"):
        result = one_round.run(0, before)
    assert isinstance(result, RoundResult) and result.round_idx == 0
    assert result.failures == {1: "failed (lost power)"} and [u.client_id for u in result.updates] == [0, 2]
    assert result.touched == (0, 1, 2) and result.stop is None
    assert any(not torch.equal(result.global_state[k], before[k]) for k in result.global_state)
    assert all(torch.equal(v, before[k]) for k, v in public_state(loop.global_model).items())  # nothing committed
    if isinstance(aggregator, FailureAware):
        assert aggregator.seen == [{1: "failed (lost power)"}]


def test_the_commit_writes_what_the_result_holds(tmp_path) -> None:
    loop = three_keylock_clients(tmp_path)
    rounds = loop.rounds
    start = {k: v.clone() for k, v in public_state(loop.global_model).items()}
    key = loop.spec.update_keys[0]
    result = RoundResult(0, {key: start[key] + 1.0}, metrics={"note": 3.0}, stop="enough")
    entry, report = rounds.commit(result)
    assert torch.equal(public_state(loop.global_model)[key], start[key] + 1.0)
    assert entry["note"] == 3.0 and loop.history == [entry] and report.stop == "enough"
