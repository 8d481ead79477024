"""Inverting Gradients at configs/inverting_gradients_full.yaml's settings breaks the models people train: a ReLU +
BatchNorm net in train mode, FedSGD with one natural photo tile, round 0 (issue 30's setting, one image, a short
budget); the measured rates over many images are in docs/attacks.md.

The config's prior weights are those measured best on a user's two-block conv-BatchNorm net; the eight-layer
ConvNet of the inversion papers needs a stronger TV and a weaker BatchNorm prior (docs/attacks.md, "A user's ReLU +
BatchNorm net"), which its test sets. The tiles are textured: on a smooth tile a flat image of its own mean colour
already scores SSIM 0.8 (docs/attacks.md, "SSIM and smooth tiles"), so the tests ask for structure beyond the colour
the leaked BatchNorm statistics give away, not for an SSIM bar alone."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from lightning_fl.attacks import InvertingGradientsAttack
from lightning_fl.attacks.metrics import own_colour_ssim, ssim
from lightning_fl.attacks.standalone import client_view
from lightning_fl.datamodules.datasets import load_dataset
from lightning_fl.models import ImageClassifier

CONFIG = Path(__file__).parents[2] / "configs" / "inverting_gradients_full.yaml"
CONVNET_PRIORS = {"tv_weight": 4.0, "bn_weight": 0.1}
"""The prior weights measured best on the eight-layer ConvNet (docs/attacks.md, "Step size and budget")."""


def test_the_full_configs_attack_recovers_a_photo_tile_from_a_relu_batchnorm_convnet() -> None:
    settings = yaml.safe_load(CONFIG.read_text())["attack"]["init_args"]
    quick = {"max_iterations": 600, "restarts": 1, "lr": 0.1, "consensus": False, "progress_bar": False}
    attack = InvertingGradientsAttack(**{**settings, **quick, **CONVNET_PRIORS})
    data = load_dataset("photo_tiles", train=True, image_size=32)
    index = data.sources.index("skimage:coffee[2,4]")
    images, labels = data.images[index : index + 1], data.labels[index : index + 1]
    images = images.float() / 255 if images.dtype == torch.uint8 else images
    torch.manual_seed(0)
    model = ImageClassifier("convnet", num_classes=data.num_classes, in_channels=3, image_size=32, standardize=False)
    reconstruction = attack.reconstruct(client_view(model, images, labels, num_classes=data.num_classes))
    recovered, colour = float(ssim(reconstruction.images, images)), float(own_colour_ssim(images))
    assert recovered >= colour + 0.1, (
        f"SSIM {recovered:.3f} against {colour:.3f} for the tile's own mean colour: the attack no longer recovers "
        "structure from the undefended ReLU + BatchNorm net"
    )
    assert reconstruction.labels.tolist() == labels.tolist()


class _UsersNet(L.LightningModule):
    """A user's own classifier, nothing of lightning-fl in it: two conv-BatchNorm-ReLU-max-pool blocks, a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 24, 3, padding=1),
            nn.BatchNorm2d(24),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(24 * 8 * 8, 9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_the_full_configs_attack_recovers_a_textured_tile_from_a_users_relu_batchnorm_net() -> None:
    settings = yaml.safe_load(CONFIG.read_text())["attack"]["init_args"]
    attack = InvertingGradientsAttack(**{**settings, "max_iterations": 800, "progress_bar": False})
    data = load_dataset("photo_tiles", train=True, image_size=32)
    index = data.sources.index("sklearn:china[2,2]")
    images, labels = data.images[index : index + 1], data.labels[index : index + 1]
    images = images.float() / 255 if images.dtype == torch.uint8 else images
    torch.manual_seed(0)
    reconstruction = attack.reconstruct(client_view(_UsersNet(), images, labels, num_classes=data.num_classes))
    recovered, colour = float(ssim(reconstruction.images, images)), float(own_colour_ssim(images))
    assert recovered >= 0.5 and recovered >= colour + 0.2, (
        f"SSIM {recovered:.3f} against {colour:.3f} for the tile's own mean colour: the attack no longer recovers "
        "a textured tile from a user's undefended ReLU + BatchNorm net"
    )
