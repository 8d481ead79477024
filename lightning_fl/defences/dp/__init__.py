"""Differential-privacy defences: per-example (Fed-CDP), client-level (Fed-SDP, DP-FedAvg with adaptive clipping),
PoGZ (DPFL), dual DP (2DP-FL), the noise and pruning baselines, and DPFL's public fine-tuning on the server."""

from lightning_fl.defences.dp.baselines import GaussianNoise, GradientPruning, add_gaussian_noise, prune_smallest
from lightning_fl.defences.dp.client_level import FedSDP, FedSDPServerNoise
from lightning_fl.defences.dp.dp_fedavg import DPFedAvg
from lightning_fl.defences.dp.dual_dp import DownlinkNoise, DualDP, DualDPFL
from lightning_fl.defences.dp.per_example_dp import ClientDPSGD, FedCDP, PerExampleDP
from lightning_fl.defences.dp.pogz import PoGZNoise, allocate_budget, dpfl_noisy_update, pogz_laplace_noise, pogz_scores
from lightning_fl.defences.dp.public_finetune import PublicFineTune

__all__ = [
    "ClientDPSGD",
    "DPFedAvg",
    "DownlinkNoise",
    "DualDP",
    "DualDPFL",
    "FedCDP",
    "FedSDP",
    "FedSDPServerNoise",
    "GaussianNoise",
    "GradientPruning",
    "PerExampleDP",
    "PoGZNoise",
    "PublicFineTune",
    "add_gaussian_noise",
    "allocate_budget",
    "dpfl_noisy_update",
    "pogz_laplace_noise",
    "pogz_scores",
    "prune_smallest",
]
