"""Shared set-up of the defence tests: one real digit, the sigmoid LeNet, DLG and IG with fixed seeds.

The victim is the server's model after the client drew its own secrets (``reset_private``); the attacker gets
what the server holds: the public gradient and ``ServerView.model``, whose private modules keep the server's
own initialisation. 16x16 images keep every attack to a few seconds.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import torch

from lightning_fl.attacks import DLGAttack, InvertingGradientsAttack
from lightning_fl.attacks.metrics import score_reconstruction
from lightning_fl.attacks.standalone import client_view
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import KeyLocks, Passports, PrivateSplit, apply_defences
from lightning_fl.messages import GroundTruth
from lightning_fl.models import ImageClassifier
from lightning_fl.private import reset_private_state

IMAGE_SIZE = 16
MODEL_SEED = 1  # DLG reaches > 80 dB on this image with this init (some inits stall, see docs/attacks.md)
DEFENCES = {
    "none": lambda: [],
    "split": lambda: [PrivateSplit(cut=1)],
    "passports": lambda: [Passports(num_convs=1, passport_size=IMAGE_SIZE)],
    "keylock": lambda: [KeyLocks(lock_init_range=0.5)],
}
ATTACKS = {
    "dlg": lambda: DLGAttack(max_iterations=300, progress_bar=False, seed=0),
    "ig": lambda: InvertingGradientsAttack(max_iterations=1000, restarts=1, progress_bar=False, seed=0),
}


def digits(**kwargs: object) -> FederatedDataModule:
    options = {"num_clients": 4, "partition": "iid", "image_size": IMAGE_SIZE, "batch_size": 32, "seed": 0}
    return FederatedDataModule("digits", **{**options, **kwargs})


def defended_model(dm: FederatedDataModule, defence: str, *, seed: int = MODEL_SEED) -> ImageClassifier:
    """The sigmoid LeNet classifier on ``dm`` with one of :data:`DEFENCES` applied, built from ``seed``."""
    torch.manual_seed(seed)
    return apply_defences(ImageClassifier("lenet_dlg", **dm.model_options), DEFENCES[defence]())


@functools.cache
def attack_scores(defence: str, attack: str) -> dict[str, float]:
    """Scores of ``attack`` on one client's single-image gradient when the attacker lacks the client's secrets."""
    dm = digits()
    images, labels = dm.sample_batch(0, 1, seed=0)
    server = defended_model(dm, defence)
    victim = copy.deepcopy(server)
    reset_private_state(victim, generator=torch.Generator().manual_seed(1234))
    view = dataclasses.replace(
        client_view(victim, images, labels, num_classes=dm.num_classes), model=copy.deepcopy(server).train()
    )
    reconstruction = ATTACKS[attack]().reconstruct(view)
    return score_reconstruction(reconstruction, GroundTruth(images, labels), num_classes=dm.num_classes)
