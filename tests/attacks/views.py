"""What the attack tests attack: a real digits batch behind a sigmoid-LeNet gradient or SGD update."""

from __future__ import annotations

import torch

from lightning_fl.attacks.standalone import client_view
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.messages import GroundTruth, ServerView
from tests.conftest import make_classifier


def digits_view(
    *, batch_size: int = 1, image_size: int = 16, local_steps: int = 1, distinct_labels: bool = False, seed: int = 0
) -> tuple[ServerView, GroundTruth]:
    """The server's view of one client's batch (and the truth, for scoring only), from a fixed-seed LeNet."""
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=image_size)
    torch.manual_seed(seed)
    model = make_classifier(dm)
    count = batch_size * local_steps
    images, labels = dm.sample_batch(0, 200 if distinct_labels else count, seed=seed)
    if distinct_labels:
        first = [int((labels == c).nonzero()[0]) for c in labels.unique()[:count]]
        images, labels = images[first], labels[first]
    view = client_view(model, images, labels, num_classes=dm.num_classes, local_steps=local_steps, lr=0.1)
    return view, GroundTruth(images, labels)


def photo_view(source: str, *, num_classes: int = 10, seed: int = 0) -> tuple[ServerView, GroundTruth]:
    """One 32x32 crop of the ``photos`` data set (e.g. ``"skimage:coffee[2,0]"``) behind one gradient of the DLG
    victim: the sigmoid LeNet at its U(-0.5, 0.5) init fed [0, 1] pixels (``standardize=False``), as in DLG's code."""
    from lightning_fl.datamodules.datasets import load_dataset
    from lightning_fl.models import ImageClassifier

    splits = (load_dataset("photos", train=train, image_size=32) for train in (True, False))
    data = next(split for split in splits if source in split.sources)
    index = data.sources.index(source)
    images, labels = data.images[index : index + 1], data.labels[index : index + 1] % num_classes
    torch.manual_seed(seed)
    model = ImageClassifier("lenet_dlg", num_classes=num_classes, in_channels=3, standardize=False)
    return client_view(model, images, labels, num_classes=num_classes), GroundTruth(images, labels)


def user_net_tile_view(*, client_id: int = 0, seed: int = 0) -> tuple[ServerView, GroundTruth]:
    """One 32x32 ``photo_tiles`` tile behind one gradient of the user's two-block conv-BatchNorm-ReLU-pool net
    (``conv_bn_pool``, [0, 1] pixels, round 0), the model of ``configs/inverting_gradients_full.yaml``."""
    from lightning_fl.models import ImageClassifier

    dm = FederatedDataModule("photo_tiles", num_clients=11, partition="iid", image_size=32, seed=0)
    torch.manual_seed(seed)
    model = ImageClassifier(
        "conv_bn_pool", num_classes=dm.num_classes, in_channels=3, image_size=32, standardize=False, lr=0.05
    )
    images, labels = dm.sample_batch(client_id, 1, seed=seed)
    return client_view(model, images, labels, num_classes=dm.num_classes, lr=0.05), GroundTruth(images, labels)
