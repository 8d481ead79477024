"""What the reliability tests share: the quickstart config, a pickled payload, and a one-line stderr check."""

from __future__ import annotations

import os
from pathlib import Path

CONFIGS = Path(__file__).parents[2] / "configs"
QUICKSTART = CONFIGS / "quickstart.yaml"
FAST = ["--loop.num_rounds", "1", "--data.image_size", "16", "--loop.progress_bar", "false"]


class Payload:
    """A pickled object that creates the directory ``marker`` when unpickled: the shape of a planted exploit."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.mkdir, (str(self.marker),)


def one_error_line(stderr: str) -> str:
    """The single ``lightning-fl: error:`` line of ``stderr``; fails on anything else (a traceback, two lines)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr}"
    assert lines[0].startswith("lightning-fl: error: ") and "Traceback" not in stderr, stderr
    return lines[0]
