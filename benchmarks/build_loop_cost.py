"""What building one federated run from a fit config costs, and the share of it the fit parser took before the
bench cached it: the median wall seconds of ``fit_parser()`` (what every ``build_fit_loop`` call used to build) and
of ``build_fit_loop`` on a small digits config (the parser built once per process). Nothing is trained.
Results: docs/performance.md, "Building a run from a config".

Run from the repository root: ``python benchmarks/build_loop_cost.py --repeats 10``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

CONFIG = {
    "seed_everything": 0,
    "data": {"dataset": "digits", "num_clients": 2, "partition": "iid", "image_size": 8},
    "model": {"class_path": "lightning_fl.models.ImageClassifier", "init_args": {"backbone": "lenet_dlg"}},
    "loop": {"num_rounds": 1, "trainer": {"accelerator": "cpu"}},
}


def median_seconds(call: Callable[[], object], repeats: int) -> float:
    """The median wall seconds of ``repeats`` calls of ``call``."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    from lightning_fl.cli_fit import build_fit_loop, fit_parser

    with tempfile.TemporaryDirectory() as folder:
        build_fit_loop(CONFIG, folder)  # imports and the cached parser, not timed
        build = median_seconds(lambda: build_fit_loop(CONFIG, folder), args.repeats)
    parse = median_seconds(fit_parser, args.repeats)
    print(
        f"fit_parser(): {parse:.3f} s; build_fit_loop with the cached parser: {build:.3f} s "
        f"(median of {args.repeats}); load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
