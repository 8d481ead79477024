"""Run recording: the per-round history, attack results, loggers (CSV, W&B, the user's), ``summary.json`` and
``curves.png``."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from lightning.pytorch.loggers import CSVLogger, Logger

from lightning_fl.messages import ClientUpdate

__all__ = ["RunRecorder"]


class RunRecorder:
    """Collects what a run reports and writes it to the loggers and ``output_dir/summary.json``.

    Args:
        output_dir: the run directory.
        loggers: extra Lightning loggers, stepped by round. A CSV logger is always added.
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
        self.round_metrics: dict[str, float] = {}
        self.stop_reason: str | None = None
        self.config: dict[str, Any] = dict(config or {})

    def log_metrics(self, metrics: dict[str, float]) -> None:
        """Add metrics to the current round's history entry."""
        self.round_metrics.update({k: float(v) for k, v in metrics.items()})

    def record_attack(self, entry: dict[str, Any]) -> None:
        """Append one attack result to ``summary.json["attacks"]``."""
        self.attacks.append(dict(entry))

    def start(self) -> None:
        """Open the loggers; a resumed run replays the finished rounds so every logger holds the whole curve."""
        self.loggers = [CSVLogger(str(self.output_dir), name="logs", version="")]
        if self.wandb_project is not None:
            from lightning_fl.federation.wandb_logger import RoundWandbLogger

            self.loggers.append(
                RoundWandbLogger(self.wandb_project, str(self.output_dir), mode=self.wandb_mode, config=self.config)
            )
        self.loggers.extend(self._extra_loggers)
        for entry in self.history:
            self._log_entry(entry)

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

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` holds."""
        accuracies = [h["test_accuracy"] for h in self.history if h.get("test_accuracy") is not None]
        return {
            "rounds_completed": len(self.history),
            "test_accuracy": accuracies[-1] if accuracies else None,
            "history": self.history,
            "attacks": self.attacks,
            "stop_reason": self.stop_reason,
        }

    def write_summary(self) -> Path:
        """Write ``summary.json`` and return its path."""
        path = self.output_dir / "summary.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.summary(), indent=2, default=float))
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
