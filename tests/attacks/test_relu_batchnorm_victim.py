"""Inverting Gradients at configs/inverting_gradients_full.yaml's settings breaks the model people train: a ReLU +
BatchNorm ConvNet in train mode, FedSGD with one natural photo tile, round 0 (issue 30's setting, one image, a short
budget with the quick budget's step size); the measured rates over many images are in docs/attacks.md."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml
from torchmetrics.functional.image import structural_similarity_index_measure

from lightning_fl.attacks import InvertingGradientsAttack
from lightning_fl.attacks.standalone import client_view
from lightning_fl.datamodules.datasets import load_dataset
from lightning_fl.models import ImageClassifier

CONFIG = Path(__file__).parents[2] / "configs" / "inverting_gradients_full.yaml"


def test_the_full_configs_attack_recovers_a_photo_tile_from_a_relu_batchnorm_convnet() -> None:
    settings = yaml.safe_load(CONFIG.read_text())["attack"]["init_args"]
    quick = {"max_iterations": 600, "restarts": 1, "lr": 0.1, "progress_bar": False}
    attack = InvertingGradientsAttack(**{**settings, **quick})
    data = load_dataset("photo_tiles", train=True, image_size=32)
    index = data.sources.index("skimage:retina[1,4]")
    images, labels = data.images[index : index + 1], data.labels[index : index + 1]
    torch.manual_seed(0)
    model = ImageClassifier("convnet", num_classes=data.num_classes, in_channels=3, image_size=32, standardize=False)
    reconstruction = attack.reconstruct(client_view(model, images, labels, num_classes=data.num_classes))
    ssim = float(structural_similarity_index_measure(reconstruction.images, images, data_range=1.0))
    assert ssim >= 0.5, f"SSIM {ssim:.3f}: the attack no longer breaks the undefended ReLU + BatchNorm net"
    assert reconstruction.labels.tolist() == labels.tolist()
