"""Benchmark grid: every attack against every defence on the same federated loop (``lightning-fl bench``)."""

from lightning_fl.bench.grid import Cell, Utility, cells, load_settings, utilities
from lightning_fl.bench.runner import run_bench

__all__ = ["Cell", "Utility", "cells", "load_settings", "run_bench", "utilities"]
