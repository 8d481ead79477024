"""Benchmark grid: every attack against every defence on the same federated loop (``lightning-fl bench``)."""

from lightning_fl.bench.experiment import build_loop, fit_config_spec, fit_spec, scratch_loop
from lightning_fl.bench.grid import Cell, Utility, cells, expand_strengths, load_settings, utilities
from lightning_fl.bench.runner import run_bench

__all__ = [
    "Cell",
    "Utility",
    "build_loop",
    "cells",
    "expand_strengths",
    "fit_config_spec",
    "fit_spec",
    "load_settings",
    "run_bench",
    "scratch_loop",
    "utilities",
]
