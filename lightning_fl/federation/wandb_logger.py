"""Weights & Biases logging keyed by communication round: one W&B row per round, ``round`` as the x-axis."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override

__all__ = ["RoundWandbLogger"]


class RoundWandbLogger(WandbLogger):
    """A :class:`~lightning.pytorch.loggers.WandbLogger` whose step is the federated round.

    Lightning's logger plots everything against ``trainer/global_step`` and writes one W&B row per
    ``log_metrics`` call, so a round that logs accuracy, ε and three attack scores becomes five rows and W&B's
    ``_step`` counts calls, not rounds. This logger instead

    * declares ``round`` the step metric of every other metric (``define_metric("*", step_metric="round")``),
    * writes the round into every row, and
    * merges every call made with the same ``step`` (the round) into one row, committed when a later round starts
      or the run ends, so attack scores and images share the round's row with accuracy and ε.

    The resolved run config is passed to ``wandb.init(config=...)``. Mode is ``offline`` unless told otherwise.

    Args:
        project: the W&B project.
        save_dir: where W&B writes its run directory (``save_dir/wandb/offline-run-*``).
        mode: ``offline``, ``online`` or ``disabled``.
        config: the resolved run config (``wandb.config``).
        **kwargs: further ``wandb.init`` arguments (``name``, ``group``, ``tags``, ...).
    """

    def __init__(
        self,
        project: str,
        save_dir: str,
        *,
        mode: str = "offline",
        config: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(project=project, save_dir=save_dir, mode=mode, config=dict(config or {}), **kwargs)
        self._wandb_init.pop("anonymous", None)  # Lightning passes it; wandb >= 0.19 warns that it has no effect
        self._open_round: int | None = None

    @property
    @override
    def experiment(self) -> Any:
        if self._experiment is None and rank_zero_only.rank == 0:
            import wandb

            if wandb.run is None:  # start the run here: Lightning's start would also make trainer/global_step the
                self._experiment = wandb.init(**self._wandb_init)  # step metric of every metric ("*")
                if hasattr(self._experiment, "define_metric"):
                    self._experiment.define_metric("round")
                    self._experiment.define_metric("*", step_metric="round", step_sync=True)
        return super().experiment

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Add ``metrics`` to the row of round ``step`` (the open round when ``step`` is ``None``)."""
        if step is not None and step != self._open_round:
            self.commit()
            self._open_round = step
        row = dict(metrics)
        if self._open_round is not None:
            row["round"] = self._open_round
        self.experiment.log(row, commit=False)

    @rank_zero_only
    def commit(self) -> None:
        """Write the open round's row."""
        if self._open_round is not None:
            self.experiment.log({}, commit=True)
            self._open_round = None

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Write the last row and finish the W&B run, so its files are complete when ``fit`` returns."""
        self.commit()
        super().finalize(status)
        if self._experiment is not None and hasattr(self._experiment, "finish"):
            self._experiment.finish(exit_code=0 if status == "success" else 1)
