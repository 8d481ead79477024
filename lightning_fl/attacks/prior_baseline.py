"""A prior-only "attack": what guessing from public data scores, to read every attack's scores against.

Not a paper's attack but the calibration row of a table: it never matches the intercepted tensors. ``guess="mean"``
returns the mean image of the public data for every leaked image; ``guess="class_sample"`` returns, for each label
read off the classifier's gradient (:func:`~lightning_fl.attacks.matching_labels.target_label_sets`, the label
inference of the gradient-matching attacks), a random public image of that class. An attack that scores no better
than this row has recovered nothing the attacker did not already know.

The public data is the attacker's own (the bench gives it the test split of the run's data set, which no client
trains on); the private images reach only the scoring step, as for every attack.
"""

from __future__ import annotations

import time
from typing import Literal

import torch
from torch import Tensor
from torch.utils.data import Dataset

from lightning_fl.attacks.base import GradientAttack, IterationCallback, Reconstruction
from lightning_fl.attacks.labels import LABEL_STRATEGIES, LabelStrategy
from lightning_fl.attacks.matching_labels import target_label_sets
from lightning_fl.attacks.targets import leaked_batch_size, matching_target
from lightning_fl.messages import ServerView

__all__ = ["GUESSES", "PriorBaseline"]

Guess = Literal["mean", "class_sample"]
GUESSES: frozenset[str] = frozenset({"mean", "class_sample"})


def _stack(data: Dataset) -> tuple[Tensor, Tensor]:
    """The ``(x, y)`` samples of ``data`` as one image tensor and one label tensor."""
    if hasattr(data, "tensors") and callable(data.tensors):  # ImageTensorDataset: no per-sample loop
        images, labels = data.tensors()
        return images.float(), labels.long()
    samples = [data[i] for i in range(len(data))]  # type: ignore[arg-type]
    images = torch.stack([torch.as_tensor(x, dtype=torch.float32) for x, _ in samples])
    return images, torch.as_tensor([int(y) for _, y in samples], dtype=torch.long)


class PriorBaseline(GradientAttack):
    """Guess the leaked images from public data alone: their mean image, or a random image of the inferred class.

    Args:
        public_data: the attacker's own images, a ``Dataset`` of ``(image, label)`` with images in [0, 1] of the
            attacked model's input shape (e.g. the test split, ``TensorDataset(images, labels)``). Never the
            client's data.
        guess: ``"mean"`` (the public mean image, no labels) or ``"class_sample"`` (labels read from the
            gradient, then a random public image of each label).
        label_strategy: the rule of :func:`~lightning_fl.attacks.labels.infer_labels` for ``"class_sample"``.
        seed: seed of the drawn images (and of the label rules' dummy inputs).

    Raises:
        ValueError: on an unknown ``guess`` or ``label_strategy``, or empty ``public_data``.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> public = TensorDataset(torch.stack([torch.zeros(1, 2, 2), torch.ones(1, 2, 2)]), torch.tensor([0, 1]))
        >>> PriorBaseline(public, guess="mean").mean_image.flatten().tolist()
        [0.5, 0.5, 0.5, 0.5]
    """

    prior_only = True
    """Marks the row as a calibration baseline for the bench's report (it never breaks a model)."""

    def __init__(
        self,
        public_data: Dataset,
        *,
        guess: Guess = "class_sample",
        label_strategy: LabelStrategy = "bias_count",
        seed: int = 0,
    ) -> None:
        if guess not in GUESSES:
            raise ValueError(f"guess={guess!r} is unknown; use one of {sorted(GUESSES)}.")
        if label_strategy not in LABEL_STRATEGIES:
            raise ValueError(f"label_strategy={label_strategy!r} is unknown; use one of {sorted(LABEL_STRATEGIES)}.")
        self.images, self.labels = _stack(public_data)
        if len(self.images) == 0:
            raise ValueError("public_data is empty; give the attacker's own images (e.g. the test split).")
        self.guess, self.label_strategy, self.seed = guess, label_strategy, seed
        self.mean_image = self.images.mean(0)
        self.name = f"prior_{guess}"

    def _labels(self, view: ServerView, num_images: int, generator: torch.Generator) -> tuple[Tensor, str]:
        """The leaked labels read off the classifier's gradient, or uniform draws when the view has no classifier
        gradient to read (the source says which)."""
        num_classes = int(view.metadata.get("num_classes") or 0)
        try:
            target = matching_target(view)
            labels = target_label_sets(
                view.model,
                target,
                num_classes=num_classes,
                input_shape=tuple(self.images.shape[1:]),
                strategy=self.label_strategy,
                seed=self.seed,
            )[0]
            return labels.cpu().long(), self.label_strategy
        except ValueError as err:
            drawn = torch.randint(max(num_classes, 1), (num_images,), generator=generator)
            return drawn, f"random ({' '.join(str(err).split())[:80]})"

    def reconstruct(self, view: ServerView, *, callback: IterationCallback | None = None) -> Reconstruction:
        """One guess per leaked image (:func:`~lightning_fl.attacks.targets.leaked_batch_size`), on the CPU.

        Raises:
            ValueError: when the public images' shape is not the view's ``metadata["input_shape"]``.
        """
        start = time.perf_counter()
        shape = view.metadata.get("input_shape")
        if shape is not None and tuple(shape) != tuple(self.images.shape[1:]):
            raise ValueError(
                f"public_data images are {tuple(self.images.shape[1:])} but the attacked model takes {tuple(shape)}; "
                "give public images of the model's input shape."
            )
        count = leaked_batch_size(view)
        generator = torch.Generator().manual_seed(self.seed)
        if self.guess == "mean":
            images = self.mean_image.expand(count, *self.mean_image.shape).clone()
            return Reconstruction(images, None, info={"guess": "mean", "seconds": time.perf_counter() - start})
        labels, source = self._labels(view, count, generator)
        picks = []
        for label in labels.tolist():
            pool = (self.labels == label).nonzero().flatten()
            pool = pool if len(pool) else torch.arange(len(self.labels))  # a class the public data lacks: any image
            picks.append(int(pool[torch.randint(len(pool), (1,), generator=generator)]))
        info = {"guess": "class_sample", "labels": source, "seconds": time.perf_counter() - start}
        return Reconstruction(self.images[picks].clone(), labels, info=info)

    def __repr__(self) -> str:
        return f"PriorBaseline(guess={self.guess!r}, public images={len(self.images)}, seed={self.seed})"
