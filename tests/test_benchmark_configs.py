"""Benchmark scripts read their settings from configs/ with flags overriding (benchmarks/_config.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

CONFIGS = Path(__file__).parents[1] / "configs"
_config = load_benchmark("_config")


def _parser(config: Path) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, default=config)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--out", type=Path)
    return parser


def test_sweep_values_are_the_defaults_and_flags_override_them(tmp_path: Path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(
        "data: {dataset: digits}\nsweep:\n  rounds: 20\n  seeds: [0, 1, 2]\n  out: runs/x\n  protocol: {draws: 3}\n"
    )
    args = _config.parse_args(_parser(config), [])
    assert (args.rounds, args.seeds, args.out) == (20, [0, 1, 2], Path("runs/x"))
    assert args.sweep["protocol"] == {"draws": 3}  # nested settings are read from the file, not flags
    assert args.fit == {"data": {"dataset": "digits"}}  # the fit config's sections
    args = _config.parse_args(_parser(config), ["--seeds", "3", "--rounds", "5"])
    assert (args.rounds, args.seeds) == (5, [3])


def test_a_misspelt_setting_is_an_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text("sweep: {roundz: 20}\n")
    with pytest.raises(SystemExit):
        _config.parse_args(_parser(config), [])
    assert "unknown settings ['roundz']" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no such file"):
        _config.parse_args(_parser(tmp_path / "missing.yaml"), [])


def test_a_flag_outside_the_sweep_section_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text("rounds: 20\n")  # the old dialect: script settings at the top level
    with pytest.raises(SystemExit):
        _config.parse_args(_parser(config), [])
    assert "settings ['rounds'] are the script's; put them under sweep:" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["dp_tables", "fdl_pp_rounds", "fed_dp_clients_per_round"])
def test_each_benchmark_config_names_existing_fit_configs(name: str) -> None:
    settings = _config.read_yaml(CONFIGS / f"{name}.yaml")["sweep"]
    named = [v for k, v in settings.items() if k.endswith("_config")]
    assert named and all((CONFIGS.parent / path).is_file() for path in named)


def test_instantiate_builds_a_fit_config_component_with_overrides() -> None:
    fit = _config.read_yaml(CONFIGS / "dpfl_digits.yaml")
    noise = _config.instantiate(fit["loop"]["client_transforms"][0], epsilon=0.5)
    assert (noise.epsilon, noise.clip_bound, noise.allocation) == (0.5, 50.0, "pogz")
