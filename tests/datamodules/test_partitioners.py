from __future__ import annotations

import numpy as np
import pytest

from lightning_fl.datamodules import partition
from lightning_fl.datamodules.partitioners import dirichlet_partition, label_bucket_partition

LABELS = np.repeat(np.arange(10), 50)


@pytest.mark.parametrize(
    ("scheme", "options"),
    [
        ("iid", {}),
        ("dirichlet", {"alpha": 0.5}),
        ("dirichlet", {"alpha": 100.0}),
        ("shards", {"shards_per_client": 2}),
        ("label_buckets", {}),
    ],
)
def test_partition_covers_every_sample_exactly_once(scheme: str, options: dict) -> None:
    parts = partition(LABELS, scheme=scheme, num_clients=7, seed=3, **options)
    merged = np.concatenate(parts)
    assert len(parts) == 7
    assert len(merged) == len(LABELS)
    assert np.array_equal(np.sort(merged), np.arange(len(LABELS)))


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards", "label_buckets"])
def test_partition_is_deterministic_given_seed(scheme: str) -> None:
    first = partition(LABELS, scheme=scheme, num_clients=5, seed=11)
    again = partition(LABELS, scheme=scheme, num_clients=5, seed=11)
    other = partition(LABELS, scheme=scheme, num_clients=5, seed=12)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    if scheme != "label_buckets":  # buckets are fixed label groups; the seed only picks which half of a class
        assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def _mean_max_class_share(parts: list[np.ndarray]) -> float:
    return float(np.mean([np.bincount(LABELS[p], minlength=10).max() / len(p) for p in parts]))


def test_dirichlet_skew_grows_as_alpha_shrinks() -> None:
    shares = [
        np.mean([_mean_max_class_share(dirichlet_partition(LABELS, num_clients=10, alpha=a, seed=s)) for s in range(5)])
        for a in (100.0, 1.0, 0.1)
    ]
    assert shares[0] < shares[1] < shares[2]
    assert shares[0] < 0.2 and shares[2] > 0.5


def test_shards_give_each_client_few_labels() -> None:
    parts = partition(LABELS, scheme="shards", num_clients=10, shards_per_client=2, seed=0)
    assert max(len(np.unique(LABELS[p])) for p in parts) <= 2


def test_label_buckets_follow_the_2dpfl_groups() -> None:
    parts = label_bucket_partition(LABELS, num_clients=15, seed=0)
    label_sets = sorted(tuple(np.unique(LABELS[p]).tolist()) for p in parts)
    expected = sorted([(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)] + [(c,) for c in range(10)])
    assert label_sets == expected


def test_overlapping_buckets_draw_from_the_whole_set() -> None:
    parts = label_bucket_partition(LABELS, num_clients=5, overlapping=True, seed=0)
    assert tuple(np.unique(LABELS[parts[0]]).tolist()) == (0, 1, 2, 3)
    assert sum(len(p) for p in parts) == 2 * len(LABELS)  # each label lies in exactly two buckets


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scheme": "dirichlet", "num_clients": 5, "alpha": 0.0}, "alpha=0.0 must be > 0"),
        ({"scheme": "iid", "num_clients": 501}, "num_clients=501 exceeds the 500 training samples"),
        ({"scheme": "shards", "num_clients": 300, "shards_per_client": 2}, "600 shards exceed"),
        ({"scheme": "nope", "num_clients": 2}, "partition='nope' is unknown"),
    ],
)
def test_partition_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        partition(LABELS, **kwargs)
