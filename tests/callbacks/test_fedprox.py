"""FedProx (Li et al., MLSys 2020): the client minimises F_k(w) + mu/2 ||w - w_t||^2; the server is FedAvg."""

from __future__ import annotations

import copy

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_fl import ClientUpdate, FedAvg, FedProx


class _Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 3, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True) + 1.0), batch_size=4)


def _fit(model: L.LightningModule, callbacks: list, steps: int = 4) -> None:
    trainer = L.Trainer(
        max_steps=steps, callbacks=callbacks, logger=False, enable_progress_bar=False, enable_checkpointing=False
    )
    trainer.fit(model, _data())


def _proximal_sgd(model: _Regression, mu: float, steps: int) -> dict[str, torch.Tensor]:
    """SGD on the loss plus (mu/2) * sum ||w - w_global||^2, the term Flower's FedProx clients add to their loss."""
    anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter([b for _ in range(steps) for b in _data()])
    for _ in range(steps):
        x, y = next(batches)
        proximal = sum(((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters())
        loss = nn.functional.mse_loss(model.net(x), y) + mu / 2 * proximal
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mu", [0.0, 0.5])
def test_fedprox_trains_on_the_proximal_objective(mu: float) -> None:
    torch.manual_seed(0)
    model = _Regression()
    expected = _proximal_sgd(copy.deepcopy(model), mu, steps=4)
    _fit(model, [FedProx(mu=mu)])
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), expected[name])


def test_fedprox_keeps_the_client_closer_to_the_global_model() -> None:
    torch.manual_seed(0)
    start = _Regression()
    drift = {}
    for mu in (0.0, 2.0):
        model = copy.deepcopy(start)
        _fit(model, [FedProx(mu=mu)], steps=8)
        drift[mu] = sum(((p - q) ** 2).sum() for p, q in zip(model.parameters(), start.parameters(), strict=True))
    assert drift[2.0] < 0.8 * drift[0.0]


def test_fedprox_rejects_negative_mu() -> None:
    with pytest.raises(ValueError, match=r"FedProx\(mu=-1.0\) must be >= 0"):
        FedProx(mu=-1.0)


def test_fedprox_server_side_equals_flower_fedprox_aggregate() -> None:
    flwr = pytest.importorskip("flwr", reason="the flower extra is not installed")
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

    generator = torch.Generator().manual_seed(1)
    start = torch.randn(4, generator=generator)
    updates = [ClientUpdate(k, 0, {"w": torch.randn(4, generator=generator)}, n, 0.0) for k, n in enumerate((3, 9))]
    strategy = flwr.server.strategy.FedProx(proximal_mu=0.1, initial_parameters=ndarrays_to_parameters([start.numpy()]))
    results = [
        (None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters([(start + u.delta["w"]).numpy()]), u.num_samples, {}))
        for u in updates
    ]
    flower = parameters_to_ndarrays(strategy.aggregate_fit(1, results, [])[0])[0]
    np.testing.assert_allclose((start + FedAvg().aggregate(updates, ctx=None)[0]["w"]).numpy(), flower, rtol=1e-6)
