"""A defence's training settings chosen per strength on a validation split: the bench's ``tune:`` search.

A DP defence trains well only with its clip bound and learning rate matched to its noise, and the match changes
with ε. A defence entry's ``tune`` names a small grid of settings (dotted paths into its utility run's spec) and,
optionally, shorter ``loop`` settings for the trials; before the utility run, each combination trains once and is
scored on the clients' validation sets (``data.val_fraction`` of each client's samples, never trained on and never
the test set), and the utility run trains with the best one. With a ``strength`` axis every strength (ε point) is
tuned on its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["TUNE_KEYS", "combinations", "tune", "validation_accuracy"]

TUNE_KEYS = {"grid", "loop"}
"""``tune: {grid: {model.init_args.lr: [0.05, 0.3], init_args.max_grad_norm: [1, 4]}, loop: {num_rounds: 10}}``:
``grid`` maps a dotted path in the utility run's spec (``init_args.X`` is short for ``defences.0.init_args.X``) to
its candidate values; ``loop`` is merged over the run's loop for the trials only."""


def combinations(grid: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of a ``tune.grid``, in the order of its keys and values.

    Raises:
        ValueError: naming the key whose candidates are not a non-empty list.

    Example:
        >>> combinations({"model.init_args.lr": [0.1, 0.3], "init_args.max_grad_norm": [1.0]})[1]
        {'model.init_args.lr': 0.3, 'init_args.max_grad_norm': 1.0}
    """
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"tune.grid.{key}: give a non-empty list of candidate values, not {values!r}.")
    return [dict(zip(grid, chosen, strict=True)) for chosen in itertools.product(*grid.values())]


def validation_accuracy(loop: Any) -> float:
    """Top-1 accuracy of ``loop``'s global model on every client's validation set together (none is trained on).

    Raises:
        ValueError: when the clients hold no validation samples (``data.val_fraction: 0``).
    """
    import torch
    from torch.utils.data import ConcatDataset, DataLoader

    data = loop.datamodule
    sets = [data.client_val_set(k) for k in range(data.num_clients)]
    if not sum(len(s) for s in sets):
        raise ValueError("tune: the clients hold no validation samples; set data.val_fraction > 0 (e.g. 0.1).")
    model = loop.global_model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in DataLoader(ConcatDataset(sets), batch_size=256):
            correct += int((model(images).argmax(dim=1) == labels).sum())
            total += len(labels)
    return correct / total


def tune(spec: Mapping[str, Any], options: Mapping[str, Any], output_dir: str | Path) -> dict[str, Any]:
    """Train ``spec`` once per combination of ``options["grid"]`` and pick the best on the validation sets.

    Args:
        spec: a utility run's spec (:meth:`Utility.spec <lightning_fl.bench.grid.Utility.spec>`).
        options: the defence's ``tune`` entry (:data:`TUNE_KEYS`).
        output_dir: the trials' run directories go under it (``trial_<i>``).

    Returns:
        ``chosen`` (the best combination, the first of equal ones), ``spec`` (``spec`` with it) and ``trials``
        (each combination with its ``val_accuracy``).

    Raises:
        ValueError: naming an unknown key of ``tune`` or a path the spec does not have.
    """
    from lightning_fl.bench.experiment import build_loop, recorded_warnings
    from lightning_fl.bench.grid import merge, set_path
    from lightning_fl.federation.run_dir import holds_run

    unknown = sorted(set(options) - TUNE_KEYS)
    if unknown or not options.get("grid"):
        raise ValueError(f"tune: unknown keys {unknown} or no grid; a tune entry has {sorted(TUNE_KEYS)}.")
    trials = []
    for i, values in enumerate(combinations(options["grid"])):
        trial = dict(spec)
        for path, value in values.items():
            trial = set_path(trial, path, value, "tune.grid")
        trial["loop"] = merge(trial["loop"], options.get("loop") or {})
        folder = Path(output_dir) / f"trial_{i}"
        with recorded_warnings(folder / "warnings.txt"):
            loop = build_loop(trial, folder)
            loop.fit(overwrite=holds_run(folder))
        trials.append({"values": values, "val_accuracy": validation_accuracy(loop)})
    best = max(trials, key=lambda t: t["val_accuracy"])  # max keeps the first of equal ones
    chosen = dict(spec)
    for path, value in best["values"].items():
        chosen = set_path(chosen, path, value, "tune.grid")
    return {"chosen": best["values"], "spec": chosen, "trials": trials}
