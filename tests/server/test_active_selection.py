"""DPFL Alg. 1: exclusion of the lowest valuations, softmax sampling, uniform exploration, valuations from losses."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from lightning_fl.contexts import FederationSpec, RoundContext
from lightning_fl.messages import ClientUpdate
from lightning_fl.server import ActiveSelector

VALUES = {k: float(k) for k in range(8)}  # client k has valuation k


def _round(k: int, seed: int) -> RoundContext:
    """Round 1 of a run of 8 clients, ``k`` a round, with master seed ``seed`` (so ``rng("select")`` differs)."""
    spec = FederationSpec(
        num_clients=8,
        clients_per_round=k,
        num_rounds=2,
        local_epochs=1,
        local_steps=None,
        seed=seed,
        batch_size=8,
        num_train_samples=(8,) * 8,
    )
    return RoundContext(spec, round_idx=1)


def _draw(selector: ActiveSelector, k: int, trials: int = 4000) -> Counter:
    counts: Counter = Counter()
    for t in range(trials):
        counts.update(selector.select(_round(k, seed=t)))
    return counts


def test_softmax_draw_follows_exp_alpha2_v_and_excludes_the_lowest_alpha1_share() -> None:
    selector = ActiveSelector(alpha1=0.5, alpha2=0.5, alpha3=0.0)
    selector.values = dict(VALUES)
    counts = _draw(selector, k=1)
    assert all(counts[k] == 0 for k in range(4))  # alpha1 * K = 4 smallest valuations are set to -inf
    weights = {k: math.exp(0.5 * k) for k in range(4, 8)}
    for k, w in weights.items():
        assert counts[k] / 4000 == pytest.approx(w / sum(weights.values()), abs=0.025)


def test_alpha3_share_is_drawn_uniformly_from_the_rest() -> None:
    selector = ActiveSelector(alpha1=0.5, alpha2=50.0, alpha3=0.5)  # softmax slot: almost surely client 7
    selector.values = dict(VALUES)
    counts = _draw(selector, k=2, trials=2800)
    assert counts[7] == 2800
    for k in range(7):  # the uniform slot: any of the 7 others, excluded clients included
        assert counts[k] / 2800 == pytest.approx(1 / 7, abs=0.025)


def test_first_round_is_uniform_and_selection_has_no_duplicates() -> None:
    selector = ActiveSelector()
    counts = _draw(selector, k=3, trials=2000)
    assert all(counts[k] / 2000 == pytest.approx(3 / 8, abs=0.04) for k in range(8))
    selector.values = dict(VALUES)
    picked = selector.select(_round(4, seed=0))
    assert len(set(picked)) == 4
    assert selector.select(_round(4, seed=0)) == picked  # the round's rng("select") is its only randomness


@pytest.mark.parametrize(
    ("loss_form", "expected"), [("sum_over_steps", 100 / 1000 * 0.5 * 20 / 100), ("mean", 100 / 1000 * 0.5)]
)
def test_valuation_is_data_share_times_loss(loss_form: str, expected: float) -> None:
    selector = ActiveSelector(loss_form=loss_form)
    spec = FederationSpec(
        num_clients=10,
        clients_per_round=2,
        num_rounds=2,
        local_epochs=1,
        local_steps=20,
        seed=0,
        batch_size=8,
        num_train_samples=(100,) * 10,
    )
    selector.total_samples, selector.spec = 1000, spec  # what setup() reads off the run's spec
    # the server's own count of local steps, never the client's report (a client cannot raise its valuation)
    update = ClientUpdate(3, 0, {}, num_samples=100, loss=0.5, metadata={"local_steps": 10_000})
    selector.observe([update])
    assert selector.values == {3: pytest.approx(expected)}
    assert selector.valuations(5).tolist() == [pytest.approx(expected)] * 5  # unseen clients get the max
    restored = ActiveSelector()
    restored.load_state_dict(selector.state_dict())
    assert restored.values == selector.values


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"alpha1": 1.0}, "alpha1 < 1"), ({"alpha2": -1.0}, "alpha2 >= 0"), ({"unseen": "min"}, "unseen")],
)
def test_active_selector_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ActiveSelector(**kwargs)
