"""Server side: aggregation maths and rules (FedAvg, server optimisers, DPFL, FedBoosting, robust rules), client
selection."""

from lightning_fl.server.active_selection import ActiveSelector
from lightning_fl.server.aggregation import Aggregator, weighted_average, weighted_sum
from lightning_fl.server.dpfl import DPFLAggregator, configured_lr
from lightning_fl.server.fedavg import FedAvg
from lightning_fl.server.fedboosting import FedBoosting
from lightning_fl.server.fedopt import FedAdagrad, FedAdam, FedAvgM, FedYogi, ServerOptimizer
from lightning_fl.server.robust import (
    CoordinateMedian,
    Krum,
    NormBounding,
    RobustAggregator,
    TrimmedMean,
    bound_norms,
    coordinate_median,
    krum_scores,
    multi_krum,
    trimmed_mean,
    update_norms,
)
from lightning_fl.server.selection import ClientSelector, UniformSelector

__all__ = [
    "ActiveSelector",
    "Aggregator",
    "ClientSelector",
    "CoordinateMedian",
    "DPFLAggregator",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedBoosting",
    "FedYogi",
    "Krum",
    "NormBounding",
    "RobustAggregator",
    "ServerOptimizer",
    "TrimmedMean",
    "UniformSelector",
    "bound_norms",
    "configured_lr",
    "coordinate_median",
    "krum_scores",
    "multi_krum",
    "trimmed_mean",
    "update_norms",
    "weighted_average",
    "weighted_sum",
]
