"""One clock for the attack benchmarks: process CPU seconds on the CPU, wall seconds after a synchronise on a GPU.

On the shared 2-core CPU, process time is what stays comparable under other people's load; on a GPU the work is
asynchronous, so only wall time bracketed by ``torch.cuda.synchronize`` measures it.
"""

from __future__ import annotations

import time

import torch


def clock(device: torch.device | str) -> float:
    """Now, in the unit that suits ``device`` (differences are seconds)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return time.process_time()
