"""Per-run pictures: ``curves.png`` (test accuracy, training loss and ε per round) next to ``summary.json``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_curves"]

_PANELS = (("test_accuracy", "test accuracy"), ("train_loss", "training loss"), ("epsilon", "ε spent"))


def plot_curves(history: Sequence[dict[str, Any]], path: str | Path) -> Path | None:
    """Draw one panel per curve the run has (accuracy, loss, ε) against the round; ``None`` when it has none.

    Uses matplotlib's object API with the Agg canvas (no display, safe in worker processes).

    Example:
        >>> import tempfile, pathlib
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "curves.png"
        >>> plot_curves([{"round": 0, "test_accuracy": 0.5, "train_loss": 1.2}], out).name
        'curves.png'
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = []
    for key, label in _PANELS:
        points = [(h["round"], h[key]) for h in history if isinstance(h.get(key), int | float)]
        if points:
            panels.append((label, points))
    if not panels:
        return None
    width = 4.0 * len(panels)
    fig = Figure(figsize=(width, 3.2))
    # fixed margins: a layout engine ("constrained") draws the figure twice to place them (0.15 s against 0.08 s)
    fig.subplots_adjust(left=0.5 / width, right=1 - 0.15 / width, bottom=0.16, top=0.9, wspace=0.25)
    FigureCanvasAgg(fig)
    for ax, (label, points) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        rounds, values = zip(*points, strict=True)
        ax.plot(rounds, values, marker="o", markersize=3)
        ax.set_xlabel("round")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
