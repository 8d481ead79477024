"""Benchmark grid: every attack against every defence on the same federated loop (``lightning-fl bench``)."""

from lightning_fl.bench.grid import Cell, cells, load_settings
from lightning_fl.bench.runner import run_bench

__all__ = ["Cell", "cells", "load_settings", "run_bench"]
