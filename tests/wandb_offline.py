"""Read an offline W&B run's ``run-*.wandb`` file (wandb's LevelDB-style record log) for tests.

wandb >= 0.19 no longer ships a Python reader for it; the format is the LevelDB log: a 7-byte header
(``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of records, each ``crc32 (4) | length (2) | type (1)``
with type 1 = full, 2 = first, 3 = middle, 4 = last fragment of one serialised ``wandb.proto.Record``.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

_BLOCK, _HEADER = 32768, 7


def records(path: str | Path) -> list[Any]:
    """Every ``Record`` protobuf of the run file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, pos, pending = [], _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def _finished_records(path: Path, timeout: float) -> list[Any]:
    """The records once the ``exit`` record is written: wandb-core may still be writing after ``finish()``."""
    deadline = time.monotonic() + timeout
    while True:
        found = records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def offline_run(run_dir: str | Path, *, timeout: float = 30.0) -> dict[str, Any]:
    """The config, the metric definitions (the last per name in ``metrics``, all in order in ``definitions``) and
    the history rows of the one offline run under ``run_dir``."""
    (path,) = Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")
    config: dict[str, Any] = {}
    metrics: dict[str, str] = {}
    definitions: list[tuple[str, str]] = []
    history: list[dict[str, Any]] = []
    for record in _finished_records(path, timeout):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "metric":
            metrics[record.metric.name or record.metric.glob_name] = record.metric.step_metric
            definitions.append((record.metric.name or record.metric.glob_name, record.metric.step_metric))
        elif kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return {"config": config, "metrics": metrics, "definitions": definitions, "history": history}
