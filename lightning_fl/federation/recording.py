"""Run recording: the per-round history, attack results, loggers (W&B, the user's), the CSVs, ``summary.json`` and
``curves.png``.

The files are durable round by round: ``logs/metrics.csv`` (one row per round) and ``logs/attacks.csv`` (one row
per attack result) get each new row appended and flushed when the round ends, and ``summary.json`` is replaced
atomically, so a killed run leaves every finished round on disk. A resumed run rewrites them from the restored
history first, so a round that was written but never committed to the checkpoint does not appear twice.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from lightning.pytorch.loggers import Logger

from lightning_fl.federation.checkpoint import atomic_write, held_signals
from lightning_fl.messages import ClientUpdate

__all__ = ["RunRecorder", "TidyCsv"]


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, default=float)
    return value


class TidyCsv:
    """A CSV file of one row per record, appended and flushed per record, rewritten when a new column appears.

    Args:
        path: the file.
        first: columns that come first (the rest follow in order of first appearance).

    Example:
        >>> import tempfile
        >>> table = TidyCsv(Path(tempfile.mkdtemp()) / "metrics.csv", first=("round",))
        >>> table.sync([{"round": 0, "loss": 0.5}]); table.sync([{"round": 0, "loss": 0.5}, {"round": 1, "acc": 0.9}])
        >>> table.path.read_text().splitlines()
        ['round,loss,acc', '0,0.5,', '1,,0.9']
    """

    def __init__(self, path: Path, *, first: Sequence[str] = ()) -> None:
        self.path, self.first = path, tuple(first)
        self._columns: list[str] = []
        self._written = -1  # rows on disk; -1: the file was not written by this object yet

    def _header(self, rows: Sequence[dict[str, Any]]) -> list[str]:
        columns = dict.fromkeys(c for c in self.first if any(c in r for r in rows))
        for row in rows:
            columns.update(dict.fromkeys(row))
        return list(columns)

    def sync(self, rows: Sequence[dict[str, Any]]) -> None:
        """Make the file hold ``rows``: append the new ones, or rewrite it atomically when the header grows."""
        if not rows:  # no file for an empty table (and none left over from a round that was not committed)
            self.path.unlink(missing_ok=True)
            self._written = 0
            return
        columns = self._header(rows)
        if self._written <= 0 or columns != self._columns or len(rows) < self._written:
            atomic_write(self.path, self._render(columns, rows, header=True))
            self._columns, self._written = columns, len(rows)
            return
        if len(rows) > self._written:
            with open(self.path, "ab") as handle:
                handle.write(self._render(columns, rows[self._written :], header=False))
                handle.flush()
                os.fsync(handle.fileno())
            self._written = len(rows)

    @staticmethod
    def _render(columns: list[str], rows: Sequence[dict[str, Any]], *, header: bool) -> bytes:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
        return out.getvalue().encode()


class RunRecorder:
    """Collects what a run reports and writes it to the loggers, the CSVs and ``output_dir/summary.json``.

    Args:
        output_dir: the run directory; ``logs/metrics.csv``, ``logs/attacks.csv`` and ``summary.json`` below it.
        loggers: extra Lightning loggers, stepped by round.
        wandb_project: if set, also log to Weights & Biases under this project.
        wandb_mode: ``offline``, ``online`` or ``disabled``.
        config: the resolved run config, logged as ``wandb.config`` (the CLI sets it; library users may too).
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        loggers: Sequence[Logger] = (),
        wandb_project: str | None = None,
        wandb_mode: Literal["offline", "online", "disabled"] = "offline",
        config: dict[str, Any] | None = None,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.wandb_project, self.wandb_mode = wandb_project, wandb_mode
        self._extra_loggers = list(loggers)
        self.loggers: list[Logger] = []
        self.history: list[dict[str, Any]] = []
        self.attacks: list[dict[str, Any]] = []
        self.privacy: dict[str, dict[str, Any]] = {}
        self.metrics_csv = TidyCsv(self.output_dir / "logs" / "metrics.csv", first=("round",))
        self.attacks_csv = TidyCsv(self.output_dir / "logs" / "attacks.csv", first=("round", "client", "attack"))
        self.config: dict[str, Any] = dict(config or {})

    def record_attack(self, entry: dict[str, Any]) -> None:
        """Append one attack result to ``summary.json["attacks"]``."""
        self.attacks.append(dict(entry))

    def start(self) -> None:
        """Open the loggers and rewrite the files from the history; a resumed run replays the finished rounds so
        every logger holds the whole curve."""
        self.loggers = []
        if self.wandb_project is not None:
            from lightning_fl.federation.wandb_logger import RoundWandbLogger

            self.loggers.append(
                RoundWandbLogger(self.wandb_project, str(self.output_dir), mode=self.wandb_mode, config=self.config)
            )
        self.loggers.extend(self._extra_loggers)
        for entry in self.history:
            self._log_entry(entry)
        self.write()

    @staticmethod
    def new_entry(round_idx: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """A round's history entry: who trained and their mean training loss (``None`` when none was logged)."""
        losses = [u.loss for u in updates if math.isfinite(u.loss)]
        return {
            "round": round_idx,
            "clients": [u.client_id for u in updates],
            "train_loss": float(np.mean(losses)) if losses else None,
        }

    def end_round(self, entry: dict[str, Any]) -> None:
        """Append a finished round's entry to the history and the loggers."""
        self.history.append(entry)
        self._log_entry(entry)

    def _log_entry(self, entry: dict[str, Any]) -> None:
        metrics = {k: v for k, v in entry.items() if isinstance(v, int | float) and k != "round"}
        for logger in self.loggers:
            logger.log_metrics(metrics, step=entry["round"])

    def summary(self, *, stop_reason: str | None = None) -> dict[str, Any]:
        """What ``summary.json`` holds; ``stop_reason``: why the run stopped before its last round."""
        accuracies = [h["test_accuracy"] for h in self.history if h.get("test_accuracy") is not None]
        return {
            "rounds_completed": len(self.history),
            "test_accuracy": accuracies[-1] if accuracies else None,
            "history": self.history,
            "attacks": self.attacks,
            "stop_reason": stop_reason,
            "privacy": self.privacy,
        }

    def write(self, *, stop_reason: str | None = None) -> Path:
        """Bring ``logs/metrics.csv``, ``logs/attacks.csv`` and ``summary.json`` up to date; returns the summary's
        path. Rows are appended and flushed, the summary is replaced atomically; Ctrl+C and SIGTERM wait."""
        path = self.output_dir / "summary.json"
        with held_signals():
            self.metrics_csv.sync(self.history)
            self.attacks_csv.sync(self.attacks)
            atomic_write(path, json.dumps(self.summary(stop_reason=stop_reason), indent=2, default=float).encode())
        return path

    def finalize(self) -> None:
        """Draw ``curves.png``, hand it and the attack table to the loggers that take images, close the loggers."""
        from lightning_fl.federation.plots import plot_curves

        curves = plot_curves(self.history, self.output_dir / "curves.png")
        last_round = self.history[-1]["round"] if self.history else None
        columns = ["round", "client", "attack", "leak_point", "psnr", "ssim", "lpips", "label_accuracy"]
        rows = [[a.get(c) for c in columns] for a in self.attacks]
        for logger in self.loggers:
            if curves is not None and hasattr(logger, "log_image"):
                logger.log_image(key="curves", images=[str(curves)], step=last_round)
            if rows and hasattr(logger, "log_table"):
                logger.log_table(key="attack_table", columns=columns, data=rows, step=last_round)
        for logger in self.loggers:
            logger.finalize("success")

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "attacks": self.attacks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.history, self.attacks = list(state["history"]), list(state["attacks"])
