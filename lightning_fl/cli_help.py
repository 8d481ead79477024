"""What ``lightning-fl`` says before it imports torch or Lightning: its subcommands, their one-line descriptions,
the top-level help and the version."""

from __future__ import annotations

from importlib import metadata

__all__ = ["DESCRIPTION", "SUBCOMMAND_HELP", "top_help", "version"]

DESCRIPTION = "The ``lightning-fl`` command: federated training, attacks, benchmarks and evaluation of saved models."

SUBCOMMAND_HELP = {
    "fit": "Federated training with per-client Lightning Trainers.",
    "attack": "One gradient-leakage attack on one batch of a client's data (no rounds).",
    "bench": "Every attack against every defence on the same loop: utility runs and short attack runs.",
    "validate": "Validate a saved public global model (global_model.safetensors) on the clients' validation splits, "
    "pooled.",
    "test": "Test a saved public global model (global_model.safetensors) on the test set.",
}
"""One line per subcommand, in the order ``lightning-fl --help`` lists them (each parser's description)."""


def top_help(prog: str = "lightning-fl") -> str:
    """The help of ``lightning-fl --help``: the subcommands and where each one's options are.

    Example:
        >>> print(top_help().splitlines()[0])
        usage: lightning-fl {fit,attack,bench,validate,test} ... [--version]
    """
    width = max(map(len, SUBCOMMAND_HELP)) + 4
    lines = [
        f"usage: {prog} {{{','.join(SUBCOMMAND_HELP)}}} ... [--version]",
        "",
        DESCRIPTION,
        "",
        "subcommands (each one's options: lightning-fl SUBCOMMAND --help):",
        *(f"  {name:<{width}}{text}" for name, text in SUBCOMMAND_HELP.items()),
        "",
        "options:",
        f"  {'-h, --help':<{width}}Show this help message and exit.",
        f"  {'--version':<{width}}Print the installed version and exit.",
    ]
    return "\n".join(lines)


def version() -> str:
    """The installed version of the ``lightning-fl`` distribution (``unknown`` when it is not installed)."""
    try:
        return metadata.version("lightning-fl")
    except metadata.PackageNotFoundError:
        return "unknown"
