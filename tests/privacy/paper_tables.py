"""Published numbers the privacy tests (and ``benchmarks/dp_tables.py --parts fed_cdp_table6``) compare against.

They are the papers' results, not library code, so they live here rather than in ``lightning_fl.privacy``
(run the benchmark with ``PYTHONPATH=$PWD`` so that ``tests`` is importable).
"""

from __future__ import annotations

FED_CDP_TABLE_VI: list[tuple[str, int, float, float]] = [
    ("Fed-CDP L=1 cancer", 4, 0.01, 0.0467),
    ("Fed-CDP L=1 adult", 11, 0.01, 0.0494),
    ("Fed-CDP L=1 LFW", 61, 0.01, 0.0689),
    ("Fed-CDP L=1 MNIST", 101, 0.01, 0.0845),
    ("Fed-CDP L=100 cancer", 301, 0.01, 0.1469),
    ("Fed-CDP L=100 adult", 1001, 0.01, 0.2761),
    ("Fed-CDP L=100 LFW", 6001, 0.01, 0.6356),
    ("Fed-CDP L=100 MNIST", 10001, 0.01, 0.8227),
    ("Fed-SDP cancer", 4, 0.1, 0.2065),
    ("Fed-SDP adult", 11, 0.1, 0.3025),
    ("Fed-SDP LFW", 61, 0.1, 0.6677),
    ("Fed-SDP MNIST", 101, 0.1, 0.8536),
]
"""Fed-CDP (Wei et al., ICDCS 2021) Table VI: ``(row, steps, sample_rate, paper epsilon)`` at sigma = 6 and
delta = 1e-5, with the step counts of spec B7 (T*L + 1, or T + 1); the classic RDP conversion reproduces them."""
