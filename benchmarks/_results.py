"""Results a benchmark script appends as its runs finish, so a cut-off run keeps what it measured."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def csv_appender(path: Path, fields: Sequence[str]) -> Iterator[Callable[[Iterable[dict[str, Any]]], None]]:
    """A function that appends rows to the CSV at ``path`` and flushes them; the header is written once, when the
    file is new (an existing file keeps its rows, so re-runs add to it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new_file = not path.exists()
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        if new_file:
            writer.writeheader()

        def append(rows: Iterable[dict[str, Any]]) -> None:
            writer.writerows(rows)
            handle.flush()

        yield append
