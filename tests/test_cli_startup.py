"""``lightning-fl --help`` and ``--version`` answer without importing torch or Lightning; the package's public names
still import on first use (issue 33)."""

from __future__ import annotations

import subprocess
import sys

import lightning_fl
from lightning_fl.cli_help import SUBCOMMAND_HELP

_PROBE = """
import sys
from lightning_fl.cli import main
code = main([{flag!r}])
heavy = sorted(m for m in ("torch", "lightning", "jsonargparse") if m in sys.modules)
print("heavy:", heavy, "code:", code)
"""


def _run(flag: str) -> str:
    done = subprocess.run([sys.executable, "-c", _PROBE.format(flag=flag)], capture_output=True, text=True, check=True)
    return done.stdout


def test_top_level_help_and_version_import_neither_torch_nor_lightning() -> None:
    help_text = _run("--help")
    assert "heavy: [] code: 0" in help_text
    assert all(name in help_text for name in SUBCOMMAND_HELP) and "Federated training" in help_text
    assert "heavy: [] code: 0" in _run("--version") and "lightning-fl 0.1.0" in _run("--version")


def test_the_package_still_exports_every_public_name() -> None:
    names = set(lightning_fl.__all__)
    assert {"FederatedLoop", "FedCDP", "DLGAttack", "ImageClassifier", "FederatedDataModule", "run_bench"} <= names
    assert all(getattr(lightning_fl, name) is not None for name in sorted(names))
    assert lightning_fl.FederatedLoop.__module__ == "lightning_fl.federation.loop"


def test_the_subcommands_help_lists_the_same_subcommands() -> None:
    from lightning_fl.cli_parsers import SUBCOMMANDS

    assert list(SUBCOMMANDS) == list(SUBCOMMAND_HELP)
