"""``lightning-fl --help`` and ``--version`` answer without importing torch or Lightning, and so do a subcommand's
``--help`` and a misspelt key once the parsers' schema is cached; the package's public names still import on first
use (issue 33)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lightning_fl
from lightning_fl.cli_help import SUBCOMMAND_HELP
from lightning_fl.cli_schema import CACHE_ENV, answer_from_cache, cached_schema, unknown_key

CONFIGS = Path(__file__).parents[1] / "configs"

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


_ARGS_PROBE = """
import sys
from lightning_fl.cli import main
try:
    code = main({args!r})
except SystemExit as err:  # the parser's --help
    code = err.code
print("heavy:", sorted(m for m in ("torch", "lightning.pytorch") if m in sys.modules), "code:", code, file=sys.stderr)
"""


def _run_args(args: list[str], cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, CACHE_ENV: str(cache)}
    return subprocess.run(
        [sys.executable, "-c", _ARGS_PROBE.format(args=args)], capture_output=True, text=True, check=True, env=env
    )


def test_a_subcommand_help_and_a_typo_answer_without_lightning_once_the_schema_is_cached(tmp_path: Path) -> None:
    """The first command builds the parsers (importing Lightning) and caches their schema; then ``fit --help`` prints
    the same help and a misspelt key (on the command line or in a config) exits 2 with the same one line, neither
    importing ``lightning.pytorch``."""
    built = _run_args(["fit", "--help"], tmp_path)
    assert "heavy: ['lightning.pytorch', 'torch'] code: 0" in built.stderr  # the parser was built
    cached = _run_args(["fit", "--help"], tmp_path)
    assert "heavy: [] code: 0" in cached.stderr and cached.stdout == built.stdout
    assert "--loop.num_rounds" in cached.stdout
    typo = _run_args(["fit", "-c", str(CONFIGS / "quickstart.yaml"), "--loop.num_roundz", "3"], tmp_path)
    assert "heavy: [] code: 2" in typo.stderr
    assert "unrecognized arguments: --loop.num_roundz 3; did you mean --loop.num_rounds?" in typo.stderr
    config = tmp_path / "typo.yaml"
    config.write_text("loop:\n  num_roundz: 3\n")
    in_yaml = _run_args(["fit", "-c", str(CONFIGS / "quickstart.yaml"), "-c", str(config)], tmp_path)
    assert "heavy: [] code: 2" in in_yaml.stderr
    assert "does not accept option 'loop.num_roundz'; did you mean 'loop.num_rounds'?" in in_yaml.stderr


_SCHEMA = {
    "flags": ["--config", "--data", "--data.dataset", "--defences", "--defences+", "--loop", "--loop.num_rounds"],
    "keys": ["config", "data", "data.dataset", "defences", "loop", "loop.num_rounds", "loop.trainer"],
    "open": ["data.dataset", "defences", "loop.trainer"],
}


@pytest.mark.parametrize(
    ("args", "unknown"),
    [
        (["--loop.num_rounds", "3", "--defences.0.init_args.sigma", "1", "--defences+", "x.Y"], None),
        (["--data.dataset.init_args.root=x", "--loop.trainer.accelerator", "cpu"], None),
        (["--loop.num_roundz=3"], "unrecognized arguments: --loop.num_roundz=3; did you mean --loop.num_rounds?"),
        (["--lop.num_rounds", "3"], "unrecognized arguments: --lop.num_rounds 3; did you mean --loop.num_rounds?"),
    ],
)
def test_unknown_key_accepts_what_the_parser_may_accept(args: list[str], unknown: str | None) -> None:
    assert unknown_key("fit", args, _SCHEMA) == unknown


_VALID = "loop: {num_rounds: 2, trainer: {max_epochs: 1}}\ndefences: [{class_path: a.B}]\ndata: {dataset: {a: 1}}"


@pytest.mark.parametrize(
    ("config", "unknown"),
    [(_VALID, None), ("loop: {num_roundz: 2}", "loop.num_roundz"), ("datta: {dataset: digits}", "datta")],
)
def test_unknown_key_reads_the_configs_keys(tmp_path: Path, config: str, unknown: str | None) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config)
    message = unknown_key("fit", ["-c", str(path)], _SCHEMA)
    assert (
        (message is None)
        if unknown is None
        else message.startswith(f"Subcommand 'fit' does not accept option '{unknown}'")
    )


def test_a_schema_of_other_code_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    (tmp_path / "cli-schema.json").write_text(json.dumps({"fingerprint": "old", "subcommands": {"fit": _SCHEMA}}))
    assert cached_schema() is None and answer_from_cache(["fit", "--lop", "1"]) is None
