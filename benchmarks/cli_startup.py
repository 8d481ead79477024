"""Start-up time of ``lightning-fl``: the wall and CPU seconds of commands that train nothing (help, a typo).

Each command runs ``--repeats`` times as a fresh process; the script prints one line per command with the median
wall seconds, the median CPU seconds (user + system of the child) and whether ``lightning.pytorch`` was imported,
then the load average (the machine's load moves the wall time more than anything here). The commands use a fresh
cache of the parsers' schema (:mod:`lightning_fl.cli_schema`) in a temporary directory: the first command run, one
``fit --help``, builds the parsers and stores it (reported as ``first command``); the timed ones then find it.
Results: docs/performance.md, "Start-up of the command".

Run from the repository root: ``python benchmarks/cli_startup.py --repeats 3``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

COMMANDS = {
    "--help": ["--help"],
    "fit --help": ["fit", "--help"],
    "attack --help": ["attack", "--help"],
    "bench --help": ["bench", "--help"],
    "fit typo": ["fit", "-c", "configs/quickstart.yaml", "--loop.num_roundz", "3"],
}

_PROBE = """
import sys
from lightning_fl.cli import main
try:
    code = main({args!r})
except SystemExit as err:
    code = err.code
print("lightning.pytorch imported:", "lightning.pytorch" in sys.modules, file=sys.stderr)
sys.exit(code)
"""


def _once(args: list[str], env: dict[str, str]) -> tuple[float, float, bool, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PROBE.format(args=args)], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, "imported: True" in done.stderr, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=list(COMMANDS), default=list(COMMANDS))
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "LIGHTNING_FL_CACHE_DIR": cache}
        wall, cpu, imported, _ = _once(COMMANDS["fit --help"], env)
        print(f"{'first command':<14} wall {wall:6.2f} s, cpu {cpu:5.2f} s, lightning.pytorch imported: {imported}")
        for name in options.only:
            runs = [_once(COMMANDS[name], env) for _ in range(options.repeats)]
            walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
            print(
                f"{name:<14} wall {statistics.median(walls):6.2f} s (min {min(walls):.2f}), "
                f"cpu {statistics.median(cpus):5.2f} s, lightning.pytorch imported: {runs[0][2]}, exit {runs[0][3]}",
                flush=True,
            )
    print(f"load average: {', '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
