"""The one place where lightning-fl builds a Lightning ``Trainer``: quiet, per client fit or evaluation."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import lightning as L

__all__ = ["QUIET_TRAINER", "build_trainer", "quiet_lightning", "trainer_options"]

QUIET_TRAINER: dict[str, Any] = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
    "limit_val_batches": 0,
}
"""Options of every inner Trainer: no logger, checkpoint, progress bar, summary or validation during fit."""

_CHATTER = (
    ".*does not have many workers.*",
    ".*number of training batches.*",
    ".*but have no `val_dataloader`.*",
    ".*LeafSpec.*",
    ".*GPU available but not used.*",
    ".*exists and is not empty.*",
)


def trainer_options(user: dict[str, Any] | None) -> dict[str, Any]:
    """The inner Trainers' options: quiet, one CPU device, then the user's ``loop.trainer`` on top.

    Raises:
        ValueError: if the user sets what the loop controls (``max_epochs``, ``max_steps``, ``callbacks``).

    Example:
        >>> trainer_options({"precision": "bf16-mixed"})["precision"]
        'bf16-mixed'
    """
    forbidden = {"max_epochs", "max_steps", "callbacks"} & set(user or {})
    if forbidden:
        raise ValueError(
            f"loop.trainer sets {sorted(forbidden)}; use loop.local_epochs / loop.local_steps / "
            "loop.defences (or loop.client_callbacks) instead."
        )
    return {**QUIET_TRAINER, "accelerator": "cpu", "devices": 1, **(user or {})}


def build_trainer(options: dict[str, Any], *, validate: bool = False, **overrides: Any) -> L.Trainer:
    """A Trainer from :func:`trainer_options` output; ``validate=True`` re-enables validation batches."""
    if validate:
        options = {k: v for k, v in options.items() if k != "limit_val_batches"}
    return L.Trainer(**options, **overrides)


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence the per-fit chatter of inner Trainers (info lines, data-loader and pytree warnings).

    Re-entrant and cheap when already quiet: ``Logger.setLevel`` clears every logger's cache, so levels are
    only touched when they differ.
    """
    names = ("lightning.pytorch", "lightning.fabric")
    loggers = [lg for lg in map(logging.getLogger, names) if lg.level != logging.WARNING]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            for message in _CHATTER:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
