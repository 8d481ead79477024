r"""Poisson subsampling of a training set, the sampling that DP-SGD's accountants assume.

The RDP and PRV accountants of DP-SGD (Abadi et al., CCS 2016, Sec. 3.1; Mironov et al., arXiv:1908.10530) bound
the privacy of one step in which every example joins the batch independently with probability :math:`q`.
:class:`PoissonBatchSampler` draws exactly such batches (their size varies, :math:`qn` on average), as Opacus'
``UniformWithReplacementSampler`` does; :func:`poisson_loader` rebuilds a ``DataLoader`` around it, keeping its
dataset, collate function and workers, with empty batches collated to zero-length tensors (Opacus'
``wrap_collate_with_empty``) so that a step on an empty batch still adds its noise.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from opacus.data_loader import dtype_safe, shape_safe, wrap_collate_with_empty
from torch.utils.data import DataLoader, Sampler

__all__ = ["PoissonBatchSampler", "poisson_loader"]


class PoissonBatchSampler(Sampler[list[int]]):
    r"""``num_batches`` batches per epoch; each holds every index independently with probability ``sample_rate``.

    Args:
        num_samples: size :math:`n` of the dataset.
        sample_rate: :math:`q`, the probability of each example to join a batch (the accountant's sampling rate).
        num_batches: batches per epoch (steps); the fixed-batch loader's length keeps the number of steps.
        generator: source of randomness (``None``: the global torch RNG).

    Raises:
        ValueError: on a rate outside (0, 1], no samples or no batches.

    Example:
        >>> batches = list(PoissonBatchSampler(10, sample_rate=0.3, num_batches=2, generator=torch.Generator()))
        >>> len(batches), all(0 <= i < 10 for b in batches for i in b)
        (2, True)
    """

    def __init__(
        self, num_samples: int, *, sample_rate: float, num_batches: int, generator: torch.Generator | None = None
    ) -> None:
        if not 0 < sample_rate <= 1:
            raise ValueError(f"PoissonBatchSampler(sample_rate={sample_rate}) must be in (0, 1]; it is B/n.")
        if num_samples < 1 or num_batches < 1:
            raise ValueError(f"PoissonBatchSampler needs samples and batches, got {num_samples=}, {num_batches=}.")
        self.num_samples, self.sample_rate, self.num_batches = num_samples, sample_rate, num_batches
        self.generator = generator

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.num_batches):
            mask = torch.rand(self.num_samples, generator=self.generator) < self.sample_rate
            yield mask.nonzero().flatten().tolist()


def poisson_loader(loader: DataLoader, *, sample_rate: float, generator: torch.Generator | None = None) -> DataLoader:
    r"""``loader`` with Poisson batches at rate ``sample_rate`` instead of shuffled fixed-size ones, same length.

    Args:
        loader: a map-style ``DataLoader`` (its dataset, collate function, workers and pinning are kept).
        sample_rate: :math:`q`; ``loader.batch_size / len(loader.dataset)`` keeps the expected batch size.
        generator: source of the sampling randomness.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> fixed = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, shuffle=True)
        >>> loader = poisson_loader(fixed, sample_rate=0.5, generator=torch.Generator().manual_seed(0))
        >>> len(loader), loader.batch_sampler.sample_rate
        (2, 0.5)
    """
    dataset = loader.dataset
    sample = dataset[0]
    fields = sample if isinstance(sample, list | tuple) else None
    collate = wrap_collate_with_empty(
        collate_fn=loader.collate_fn,
        sample_empty_shapes=None if fields is None else [(0, *shape_safe(x)) for x in fields],
        dtypes=None if fields is None else [dtype_safe(x) for x in fields],
    )
    return DataLoader(
        dataset,
        batch_sampler=PoissonBatchSampler(
            len(dataset), sample_rate=sample_rate, num_batches=len(loader), generator=generator
        ),
        collate_fn=collate,
        num_workers=loader.num_workers,
        pin_memory=loader.pin_memory,
        persistent_workers=loader.persistent_workers if loader.num_workers else False,
    )
