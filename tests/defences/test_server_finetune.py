from pathlib import Path

import pytest
import torch

from lightning_fl import FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import PublicFineTune
from tests.conftest import make_classifier


def test_public_fine_tuning_alone_trains_the_global_model(tmp_path: Path) -> None:
    """DPFL's public-data control (spec A.5): with no client signal, fine-tuning alone must still learn."""
    dm = FederatedDataModule("digits", num_clients=4, partition="iid", image_size=16, seed=0)
    torch.manual_seed(0)
    loop = FederatedLoop(
        make_classifier(dm, lr=1e-2),
        dm,
        num_rounds=3,
        clients_per_round=1,
        local_steps=1,
        server_transforms=[PublicFineTune(num_samples=200, epochs=2)],
        output_dir=tmp_path,
        checkpoint=False,
        progress_bar=False,
    )
    accuracies = [h["test_accuracy"] for h in loop.fit()["history"]]
    assert accuracies[-1] > 0.5


@pytest.mark.parametrize(("kwargs", "match"), [({"num_samples": 0}, ">= 1"), ({"source": "train"}, "source")])
def test_public_fine_tune_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PublicFineTune(**kwargs)
