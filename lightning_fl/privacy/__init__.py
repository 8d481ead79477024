"""Privacy mechanisms, clipping and accounting shared by the DP defences."""

from lightning_fl.privacy.accounting import (
    TF_PRIVACY_ORDERS,
    PrivacyAccountant,
    PrivacyLedger,
    PureDPAccountant,
    calibrate_noise_multiplier,
    classic_rdp_epsilon,
)
from lightning_fl.privacy.clipping import clip_per_tensor, clip_state, clip_update, state_norm
from lightning_fl.privacy.mechanisms import gaussian_noise, laplace_noise
from lightning_fl.privacy.reconstruction import rero_dp_sgd, rero_gaussian, rero_rdp
from lightning_fl.privacy.sampling import PoissonBatchSampler, poisson_loader
from lightning_fl.privacy.schedules import Schedule

__all__ = [
    "TF_PRIVACY_ORDERS",
    "PoissonBatchSampler",
    "PrivacyAccountant",
    "PrivacyLedger",
    "PureDPAccountant",
    "Schedule",
    "calibrate_noise_multiplier",
    "classic_rdp_epsilon",
    "clip_per_tensor",
    "clip_state",
    "clip_update",
    "gaussian_noise",
    "laplace_noise",
    "poisson_loader",
    "rero_dp_sgd",
    "rero_gaussian",
    "rero_rdp",
    "state_norm",
]
