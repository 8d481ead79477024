"""The command's defaults where they differ from the Python API's (issue 33)."""

from __future__ import annotations

import inspect

from lightning_fl import FederatedLoop
from lightning_fl.cli_parsers import SUBCOMMANDS


def test_fit_vectorises_plain_clients_by_default_and_the_python_loop_does_not() -> None:
    # the quickstart's history under auto equals the one-by-one fit's to 6e-7 in loss (docs/performance.md)
    assert SUBCOMMANDS["fit"]().get_defaults().loop.vectorize == "auto"
    assert inspect.signature(FederatedLoop).parameters["vectorize"].default is False
