"""The ``lightning-fl`` command: ``fit`` (federated training), ``attack`` (one attack on one batch), ``bench``
(every attack against every defence, :mod:`lightning_fl.bench`), ``validate`` / ``test`` (a saved public global
model, ``global_model.safetensors``, on the validation or test data).

``lightning-fl --help`` and ``--version`` answer from :mod:`lightning_fl.cli_help` without importing torch or
Lightning; a bare ``SUBCOMMAND --help`` and an unknown key answer from the cached schema of the subcommands'
parsers (:mod:`lightning_fl.cli_schema`) when it is current; everything else is parsed and run by
:mod:`lightning_fl.cli_run`, which builds the parsers from the classes' signatures (and stores that cache).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lightning_fl.cli_help import top_help, version

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lightning-fl``; returns the exit code (see :func:`lightning_fl.cli_run.main`).

    Example:
        >>> main(["--version"])  # doctest: +ELLIPSIS
        lightning-fl ...
        0
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["-h"], ["--help"]):
        print(top_help())
        return 0
    if args == ["--version"]:
        print(f"lightning-fl {version()}")
        return 0
    from lightning_fl.cli_schema import answer_from_cache

    answered = answer_from_cache(args)
    if answered is not None:
        return answered
    from lightning_fl.cli_run import main as run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
