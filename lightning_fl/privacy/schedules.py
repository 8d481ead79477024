"""Per-round schedules for a clip bound or a noise multiplier (Fed-CDP(decay) and variants)."""

from __future__ import annotations

import math
from typing import Literal

__all__ = ["SCHEDULES", "Schedule", "ScheduleKind"]

ScheduleKind = Literal["constant", "linear", "step", "exponential", "cosine"]


def _progress(round_idx: int, num_rounds: int) -> float:
    return min(round_idx, num_rounds - 1) / max(num_rounds - 1, 1)


SCHEDULES = {
    "constant": lambda s, t: s.start,
    "linear": lambda s, t: s.start + (s.end - s.start) * _progress(t, s.num_rounds),
    "step": lambda s, t: s.start * s.gamma ** (t // s.step_size),
    "exponential": lambda s, t: s.start * (s.end / s.start) ** _progress(t, s.num_rounds),
    "cosine": lambda s, t: s.end + 0.5 * (s.start - s.end) * (1 + math.cos(math.pi * _progress(t, s.num_rounds))),
}


class Schedule:
    r"""A value that changes with the 0-based round index.

    Fed-CDP(decay) (Wei et al., ICDCS 2021, Sec. VII-A) decays the clip bound linearly from C=6 to C=2 over
    100 rounds: ``Schedule(6.0, end=2.0, kind="linear", num_rounds=100)``, so
    :math:`C(t) = C_0 - (C_0 - C_{end})\, t / (T-1)` (Inferred: endpoints at t=0 and t=T-1).
    The other kinds are library options, not from the paper: ``step`` multiplies by ``gamma`` every
    ``step_size`` rounds, ``exponential`` moves geometrically from ``start`` to ``end``, ``cosine`` anneals.

    Args:
        start: value at round 0.
        end: value at round ``num_rounds - 1`` (``linear``, ``exponential``, ``cosine``); defaults to ``start``.
        kind: the schedule's shape.
        num_rounds: rounds over which the value moves from ``start`` to ``end``; later rounds keep ``end``.
        step_size: rounds between two multiplications by ``gamma`` (``step``).
        gamma: factor of the ``step`` schedule.

    Raises:
        ValueError: on an unknown ``kind``, a non-positive ``start``/``end`` or ``num_rounds < 1``.

    Example:
        >>> decay = Schedule(6.0, end=2.0, kind="linear", num_rounds=100)
        >>> decay(0), decay(99), round(decay(50), 3)
        (6.0, 2.0, 3.98)
    """

    def __init__(
        self,
        start: float,
        *,
        end: float | None = None,
        kind: ScheduleKind = "constant",
        num_rounds: int = 100,
        step_size: int = 10,
        gamma: float = 0.5,
    ) -> None:
        if kind not in SCHEDULES:
            raise ValueError(f"Schedule(kind={kind!r}) is unknown; use one of {sorted(SCHEDULES)}.")
        end = start if end is None else end
        if not (0 < start < math.inf and 0 < end < math.inf):
            raise ValueError(
                f"Schedule(start={start}, end={end}): a clip bound or noise multiplier must stay a finite number > 0; "
                "set the schedule's init_args.start and init_args.end to positive values (e.g. start: 6.0, end: 2.0)."
            )
        if num_rounds < 1 or step_size < 1:
            raise ValueError(f"Schedule(num_rounds={num_rounds}, step_size={step_size}) must both be >= 1.")
        self.start, self.end, self.kind = float(start), float(end), kind
        self.num_rounds, self.step_size, self.gamma = num_rounds, step_size, gamma

    def __call__(self, round_idx: int) -> float:
        return float(SCHEDULES[self.kind](self, round_idx))

    def __repr__(self) -> str:
        return f"Schedule({self.start}, end={self.end}, kind={self.kind!r}, num_rounds={self.num_rounds})"
