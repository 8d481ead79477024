"""Poisson sampling: the batches DP-SGD's accountant assumes, drawn by PerExampleDP at the rate it records."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_fl import FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import FedCDP, PerExampleDP
from lightning_fl.privacy import PoissonBatchSampler, poisson_loader
from tests.conftest import make_classifier
from tests.defences.test_per_example_dp import _TRAINER, Linear


def test_poisson_batches_have_binomial_sizes() -> None:
    n, q = 200, 0.1
    sampler = PoissonBatchSampler(n, sample_rate=q, num_batches=2000, generator=torch.Generator().manual_seed(0))
    sizes = torch.tensor([len(b) for b in sampler], dtype=torch.float64)
    assert abs(sizes.mean() - n * q) < 3 * (n * q * (1 - q) / len(sizes)) ** 0.5
    assert sizes.var() == pytest.approx(n * q * (1 - q), rel=0.15)  # a fixed-size loader has variance 0


def test_poisson_loader_keeps_length_and_collates_empty_batches() -> None:
    data = DataLoader(TensorDataset(torch.randn(10, 3), torch.randn(10, 2)), batch_size=5)
    loader = poisson_loader(data, sample_rate=1e-9, generator=torch.Generator().manual_seed(0))
    batches = list(loader)
    assert len(batches) == len(data) == 2
    assert [tuple(t.shape) for t in batches[0]] == [(0, 3), (0, 2)]


class _BatchSizes(L.Callback):
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.loader_rate: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.sizes.append(len(batch[0]))
        sampler = getattr(trainer.train_dataloader, "batch_sampler", None)
        self.loader_rate = getattr(sampler, "sample_rate", None)


@pytest.mark.parametrize("sampling", ["poisson", "shuffled_batches"])
def test_per_example_dp_records_the_rate_its_loader_samples_at(sampling: str) -> None:
    dp, seen = PerExampleDP(noise_multiplier=1.0, sampling=sampling, seed=0), _BatchSizes()
    data = TensorDataset(torch.randn(40, 3), torch.randn(40, 2))
    L.Trainer(max_steps=20, max_epochs=-1, callbacks=[dp, seen], **_TRAINER).fit(
        Linear(lr=0.1), DataLoader(data, batch_size=8, shuffle=True)
    )
    recorded = {rate for _, rate, _ in dp.privacy_accountant.history}
    assert recorded == {8 / 40} and sum(steps for *_, steps in dp.privacy_accountant.history) == 20
    if sampling == "poisson":
        assert seen.loader_rate == 8 / 40 and len(set(seen.sizes)) > 2  # B = 8 only on average
    else:
        assert seen.loader_rate is None and set(seen.sizes) == {8}


def test_per_example_dp_rejects_unknown_sampling() -> None:
    with pytest.raises(ValueError, match=r"sampling='uniform'.*'poisson'"):
        PerExampleDP(sampling="uniform")


@pytest.mark.parametrize("sampling", ["poisson", "shuffled_batches"])
def test_fed_cdp_summary_states_the_sampling_it_used(tmp_path: Path, sampling: str) -> None:
    dm = FederatedDataModule("digits", num_clients=4, partition="iid", image_size=16, batch_size=16, seed=0)
    torch.manual_seed(0)
    summary = FederatedLoop(
        make_classifier(dm),
        dm,
        num_rounds=1,
        clients_per_round=2,
        local_steps=2,
        eval_every=0,
        progress_bar=False,
        checkpoint=False,
        defences=[FedCDP(noise_multiplier=1.0, sampling=sampling)],
        output_dir=tmp_path,
    ).fit()
    facts = summary["privacy"]["FedCDP"]
    assert facts["sampling"] == sampling and ("note" in facts) == (sampling == "shuffled_batches")
    assert summary["history"][0]["epsilon"] > 0
