"""Mix each training example with k - 1 others of the client's data (and soft labels): MixUp's and InstaHide's core.

:class:`MixingDefence` is a Lightning callback: before each training step it replaces the batch's inputs by
mixtures and its labels by the mixed one-hot labels, and after the loss (``on_before_backward``) it puts the
original batch back, so what the loop records of the batch (the ground truth of an attack) stays the private
examples. The model's ``training_step`` must accept soft labels, class probabilities of shape ``(B, C)``, as
``F.cross_entropy`` does.
"""

from __future__ import annotations

import abc
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import default_collate
from typing_extensions import override

from lightning_fl.defences.base import Defence, DefenceParts

__all__ = ["MixingDefence", "mix_examples"]


def mix_examples(
    inputs: Tensor, labels: Tensor, coefficients: Tensor, *, num_classes: int, label_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    r"""Mix ``k`` examples per row: :math:`\tilde x_i = \sum_j \lambda_{ij} x_{ij}`,
    :math:`\tilde y_i = \sum_j \lambda_{ij} m_j \, \mathrm{onehot}(y_{ij})` (Zhang et al., ICLR 2018, Eq. 1;
    InstaHide, Huang et al., ICML 2020, Sec. 3).

    Args:
        inputs: ``(B, k, ...)``, row ``i`` holds the ``k`` examples mixed into the ``i``-th mixture.
        labels: ``(B, k)`` class indices.
        coefficients: ``(B, k)`` mixing weights :math:`\lambda`, each row summing to 1.
        num_classes: C, the width of the soft labels.
        label_mask: ``(k,)`` of 0/1, :math:`m_j`: which of the ``k`` slots count in the label (InstaHide's public
            images do not); ``None``: all.

    Returns:
        The mixed inputs ``(B, ...)`` and soft labels ``(B, C)``.

    Example:
        >>> x = torch.tensor([[[0.0, 2.0], [4.0, 6.0]]])
        >>> mixed, soft = mix_examples(x, torch.tensor([[0, 2]]), torch.tensor([[0.25, 0.75]]), num_classes=3)
        >>> mixed, soft
        (tensor([[3., 5.]]), tensor([[0.2500, 0.0000, 0.7500]]))
    """
    weights = coefficients.to(inputs.dtype)
    mixed = (weights.view(*weights.shape, *[1] * (inputs.dim() - 2)) * inputs).sum(dim=1)
    label_weights = weights if label_mask is None else weights * label_mask.to(weights)
    soft = (label_weights.unsqueeze(-1) * F.one_hot(labels, num_classes).to(weights)).sum(dim=1)
    return mixed, soft


class MixingDefence(Defence, L.Callback, metaclass=abc.ABCMeta):
    """Base of the mixing defences: draws ``k - 1`` partners per example from the client's training set.

    Subclasses give the coefficients (:meth:`coefficients`) and may change the mixtures (:meth:`finish`). The
    partners are drawn uniformly, with replacement, from the dataset of the Trainer's training loader (the whole
    private data of the client, as GradAttack mixes over the data set, not only within the batch: with a batch of
    one image, mixing within it would change nothing).

    Args:
        k: examples per mixture (the example itself and ``k - 1`` partners); ``k = 1`` leaves the batch as it is.
        num_classes: C; ``None`` reads the run's data's (:meth:`use_data`), else the model's ``num_classes``
            attribute or hyperparameter.
        seed: seeds the draws (partners, coefficients, signs); one generator runs over all fits of the run.

    Raises:
        ValueError: if ``k < 1``; when the run is built, if the number of classes is unknown; at run time, if the
            batch is not a list ``[inputs, labels, ...]``.
    """

    def __init__(self, *, k: int, num_classes: int | None = None, seed: int = 0) -> None:
        name = type(self).__name__
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"{name}(k={k!r}) must be an integer >= 1; it is the number of examples per mixture.")
        if num_classes is not None and num_classes < 2:
            raise ValueError(f"{name}(num_classes={num_classes}) must be >= 2 (or None to read the model's).")
        self.k, self.num_classes, self.seed = k, num_classes, seed
        self._generator = torch.Generator().manual_seed(seed)
        self._original: tuple[list[Any], Tensor, Tensor] | None = None
        self._data_classes: int | None = None

    @override
    def parts(self) -> DefenceParts:
        return DefenceParts(client_callbacks=[self])

    @override
    def use_data(self, data: Any) -> None:
        classes = getattr(data, "num_classes", None)
        self._data_classes = int(classes) if classes is not None else None

    @override
    def check_model(self, model: nn.Module) -> None:
        if self.k > 1:
            self.classes(model)

    def classes(self, model: nn.Module) -> int:
        """C, the width of the soft labels: ``num_classes`` as given, else the data's, else the model's.

        Raises:
            ValueError: if none of them gives it.
        """
        hparams = getattr(model, "hparams", None) or {}
        found = self.num_classes or self._data_classes or getattr(model, "num_classes", None)
        found = found or hparams.get("num_classes")
        if found is None:
            raise ValueError(
                f"{type(self).__name__}(num_classes=None): neither the run's data nor {type(model).__name__} "
                "(a num_classes attribute or hyperparameter) says how many classes the soft labels have; set it."
            )
        return int(found)

    @abc.abstractmethod
    def coefficients(self, rows: int, generator: torch.Generator) -> Tensor:
        """``(rows, k)`` mixing weights, each row summing to 1."""

    def finish(self, mixed: Tensor, generator: torch.Generator) -> Tensor:
        """The mixtures as the model trains on them (default: unchanged)."""
        return mixed

    def label_mask(self) -> Tensor | None:
        """Which of the ``k`` slots count in the soft label (default: all)."""
        return None

    def partners(self, trainer: L.Trainer, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``count`` examples drawn uniformly from the training set of ``trainer``: ``(inputs, labels)``."""
        dataset = getattr(trainer.train_dataloader, "dataset", None)
        if dataset is None:
            raise ValueError(f"{type(self).__name__} draws partners from the training loader's dataset; it has none.")
        indices = torch.randint(len(dataset), (count,), generator=generator).tolist()
        inputs, labels = default_collate([dataset[i] for i in indices])[:2]
        return inputs, labels

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.k == 1:
            return
        if not (isinstance(batch, list) and len(batch) >= 2 and all(isinstance(b, Tensor) for b in batch[:2])):
            raise ValueError(
                f"{type(self).__name__} mixes batches that are lists [inputs, labels, ...] of tensors; got "
                f"{type(batch).__name__}. Use a DataLoader with the default collate (a TensorDataset gives lists)."
            )
        inputs, labels = batch[0], batch[1]
        num_classes = self.classes(pl_module)
        rows = len(labels)
        other_x, other_y = self.partners(trainer, rows * (self.k - 1), self._generator)
        slots_x = torch.cat([inputs.unsqueeze(1), other_x.to(inputs).view(rows, self.k - 1, *inputs.shape[1:])], 1)
        slots_y = torch.cat([labels.unsqueeze(1), other_y.to(labels).view(rows, self.k - 1)], 1)
        weights = self.coefficients(rows, self._generator).to(inputs.device)
        mask = self.label_mask()
        mixed, soft = mix_examples(slots_x, slots_y, weights, num_classes=int(num_classes), label_mask=mask)
        self._original = (batch, inputs, labels)
        batch[0], batch[1] = self.finish(mixed, self._generator), soft

    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        self._restore()

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._restore()

    def _restore(self) -> None:
        """Put the private batch back, so the loop's records of it (attack ground truth) are the real examples."""
        if self._original is not None:
            batch, inputs, labels = self._original
            batch[0], batch[1] = inputs, labels
            self._original = None
