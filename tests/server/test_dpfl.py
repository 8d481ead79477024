import pytest
import torch

from lightning_fl.messages import ClientUpdate
from lightning_fl.server import DPFLAggregator
from tests.conftest import plugin_context


def _updates() -> list[ClientUpdate]:
    return [
        ClientUpdate(0, 0, {"w": torch.tensor([1.0])}, num_samples=10, loss=0.1, metadata={"lr": 0.01}),
        ClientUpdate(1, 0, {"w": torch.tensor([4.0])}, num_samples=30, loss=0.1, metadata={"lr": 0.01}),
    ]


def test_faithful_form_scales_by_eta_and_share_of_all_clients_samples() -> None:
    aggregator = DPFLAggregator(server_lr=0.01)
    aggregator.total_samples = 400  # K clients hold 400 samples; the two selected hold 40
    delta = aggregator.aggregate(_updates(), ctx=plugin_context({"w": torch.zeros(1)}))[0]
    assert delta["w"].item() == pytest.approx(0.01 * (10 * 1.0 + 30 * 4.0) / 400)


def test_fedavg_form_is_the_sample_weighted_mean() -> None:
    delta = DPFLAggregator(form="fedavg").aggregate(_updates(), ctx=plugin_context({"w": torch.zeros(1)}))[0]
    assert delta["w"].item() == pytest.approx((10 * 1.0 + 30 * 4.0) / 40)


def test_unknown_form_is_rejected() -> None:
    with pytest.raises(ValueError, match="eta_over_all_samples"):
        DPFLAggregator(form="literal")
