"""Every YAML in configs/ is one of two dialects: a bench config, or a fit/attack config plus at most ``sweep:``.

A bench config is what :func:`lightning_fl.bench.grid.load_settings` reads (``lightning-fl bench``). Every other
file is a ``lightning-fl fit`` or ``attack`` config, checked by that subcommand's own parser (types, class paths,
keys); a benchmark script's file adds one ``sweep:`` section for its own axes (benchmarks/_config.py) and may leave
out what the script builds itself (the model, when the script varies it), so the parser's required keys are not
asked of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonargparse import ArgumentParser

from lightning_fl.bench.grid import load_settings
from lightning_fl.cli_parsers import SUBCOMMANDS

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))
SWEEP = "sweep"
_ATTACK_KEYS = {"attack", "run", "ckpt_path"}
"""Top-level keys only ``lightning-fl attack`` takes."""
_BENCH_KEYS = {"threat_models", "base"}
"""Top-level keys only a bench config has (a config starting from another, ``base:``, may have nothing else of the
grid)."""


@pytest.fixture(scope="module")
def parsers() -> dict[str, ArgumentParser]:
    built = {name: SUBCOMMANDS[name]() for name in ("fit", "attack")}
    for parser in built.values():
        parser.exit_on_error = False  # an error raises, naming the key, instead of exiting
    return built


def check_dialect(path: Path, parsers: dict[str, ArgumentParser]) -> str:
    """The dialect of the config at ``path`` (``bench``, ``fit`` or ``attack``); raises naming what is wrong."""
    settings: dict[str, Any] = yaml.safe_load(path.read_text())
    if _BENCH_KEYS & set(settings):
        load_settings(path)
        load_settings(path, quick=True)
        return "bench"
    sweep = settings.pop(SWEEP, None)
    if sweep is not None and not isinstance(sweep, dict):
        raise ValueError(f"{path.name}: {SWEEP}: holds a mapping of the script's settings")
    command = "attack" if _ATTACK_KEYS & set(settings) else "fit"
    parsers[command].parse_object(settings, _skip_required=sweep is not None)
    return command


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_every_config_is_a_bench_config_or_a_fit_config_plus_a_sweep(
    path: Path, parsers: dict[str, ArgumentParser]
) -> None:
    assert check_dialect(path, parsers) in ("bench", "fit", "attack")


def test_a_script_setting_outside_the_sweep_fails(tmp_path: Path, parsers: dict[str, ArgumentParser]) -> None:
    old = tmp_path / "label_recovery.yaml"  # the per-script dialect: a list of dataset names where data: is a fit's
    old.write_text("data: [digits, photos]\nbatch_sizes: [1, 4]\n")
    with pytest.raises(Exception, match=r"data|batch_sizes"):
        check_dialect(old, parsers)
    new = tmp_path / "label_recovery_sweep.yaml"
    new.write_text("sweep: {data: [digits, photos], batch_sizes: [1, 4]}\n")
    assert check_dialect(new, parsers) == "fit"


def test_a_component_not_written_as_the_fit_config_writes_it_fails(
    tmp_path: Path, parsers: dict[str, ArgumentParser]
) -> None:
    config = tmp_path / "defence_tables.yaml"  # the model as bare init_args, not class_path/init_args
    config.write_text("model: {backbone: lenet_dlg, lr: 0.002}\nsweep: {images: 4}\n")
    with pytest.raises(Exception, match="model"):
        check_dialect(config, parsers)
