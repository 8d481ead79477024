import itertools

import pytest

from lightning_fl.privacy import Schedule


def test_fed_cdp_decay_runs_from_6_to_2_over_100_rounds() -> None:
    decay = Schedule(6.0, end=2.0, kind="linear", num_rounds=100)
    values = [decay(t) for t in range(120)]
    assert values[0] == 6.0 and values[99] == pytest.approx(2.0) and values[119] == pytest.approx(2.0)
    assert all(a >= b for a, b in itertools.pairwise(values))


@pytest.mark.parametrize(
    ("kind", "round_idx", "expected"),
    [("constant", 50, 4.0), ("step", 25, 1.0), ("exponential", 9, 1.0), ("cosine", 9, 1.0), ("cosine", 0, 4.0)],
)
def test_schedule_kinds(kind: str, round_idx: int, expected: float) -> None:
    schedule = Schedule(4.0, end=1.0, kind=kind, num_rounds=10, step_size=10, gamma=0.5)
    assert schedule(round_idx) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "warmup"}, "unknown"),
        ({"end": 0.0}, "must stay a finite number > 0"),
        ({"num_rounds": 0}, "num_rounds"),
    ],
)
def test_schedule_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Schedule(1.0, **kwargs)
