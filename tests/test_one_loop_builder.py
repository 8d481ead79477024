"""One builder of a federated run: ``lightning-fl fit`` and the bench build the same loop from one config.

The fit command and :func:`lightning_fl.bench.build_loop` (every bench run and benchmark script) go through the fit
command's own parser and :func:`lightning_fl.cli_fit.assemble_loop`, so the same config gives the same model (its
data options linked from the data, whatever the config says), defences, loop settings and random state; and
``FederatedLoop(...)`` is called in one module outside ``federation/``. Every ``class_path`` entry, of a fit config or
not, is made by jsonargparse: no module calls a class it loaded from a class path itself.
"""

from __future__ import annotations

import ast
import functools
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from lightning_fl.bench import build_loop, fit_config_spec
from lightning_fl.cli import main
from lightning_fl.federation import FederatedLoop

ROOT = Path(__file__).parents[1]

FIT = {
    "seed_everything": 5,
    "data": {"dataset": "digits", "num_clients": 3, "partition": "iid", "image_size": 8, "batch_size": 16},
    "model": {  # num_classes and in_channels as a user might write them: the data links 10 and 1 in
        "class_path": "lightning_fl.models.ImageClassifier",
        "init_args": {"backbone": "lenet_dlg", "num_classes": 3, "in_channels": 3, "lr": 0.05},
    },
    "defences": [{"class_path": "lightning_fl.defences.KeyLocks", "init_args": {"key_length": 8}}],
    "loop": {"num_rounds": 1, "clients_per_round": 2, "local_steps": 1, "trainer": {"accelerator": "cpu"}},
}


def _built(loop: FederatedLoop) -> dict[str, Any]:
    """What decides how ``loop`` trains, read right after it is built."""
    model = loop.global_model
    return {
        "model": (type(model).__name__, dict(model.hparams)),
        "state": {key: value.clone() for key, value in model.state_dict().items()},
        "defences": [repr(d) for d in loop.defences],
        "settings": (loop.num_rounds, loop.clients_per_round, loop.local_epochs, loop.local_steps, loop.seed),
        "vectorize": loop.vectorised.mode,
        "links": loop.datamodule.model_options,
        "clients": [loop.datamodule.num_train_samples(k) for k in range(loop.num_clients)],
        "rng": (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()),
    }


@pytest.fixture
def built_loops(monkeypatch) -> list[dict[str, Any]]:
    """Every ``FederatedLoop`` built while the test runs, as :func:`_built` reads it at the end of ``__init__``."""
    seen: list[dict[str, Any]] = []
    init = FederatedLoop.__init__

    @functools.wraps(init)  # the fit command's parser reads the loop's settings from this signature
    def recording_init(self: FederatedLoop, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        seen.append(_built(self))

    monkeypatch.setattr(FederatedLoop, "__init__", recording_init)
    return seen


def test_the_fit_command_and_the_bench_build_the_same_loop_from_one_config(tmp_path, built_loops) -> None:
    config = tmp_path / "fit.yaml"
    config.write_text(yaml.safe_dump(FIT))
    assert main(["fit", "-c", str(config), "--output_dir", str(tmp_path / "fit")]) == 0
    build_loop(fit_config_spec(config), tmp_path / "bench")
    command, bench = built_loops
    assert command["model"][1]["num_classes"] == 10 and command["model"][1]["in_channels"] == 1  # the data's
    for key in ("model", "defences", "settings", "vectorize", "links", "clients"):
        assert bench[key] == command[key], key
    assert command["vectorize"] == "auto"  # the fit command's default, not FederatedLoop's
    assert command["state"].keys() == bench["state"].keys()
    assert all(torch.equal(command["state"][k], bench["state"][k]) for k in command["state"])
    assert torch.equal(command["rng"][0], bench["rng"][0]) and (command["rng"][1] == bench["rng"][1]).all()
    assert command["rng"][2] == bench["rng"][2]


def _constructs_the_loop(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name | ast.Attribute)
        and ast.unparse(node.func) in ("FederatedLoop", "federation.FederatedLoop", "lightning_fl.FederatedLoop")
        for node in ast.walk(tree)
    )


def test_federated_loop_is_built_in_one_module_outside_the_federation() -> None:
    """The library and the benchmark scripts call ``FederatedLoop(...)`` in ``cli_fit.py`` only (docstrings and
    the federation package itself aside)."""
    package = ROOT / "lightning_fl"
    sources = [p for p in package.rglob("*.py") if "federation" not in p.relative_to(package).parts]
    sources += sorted((ROOT / "benchmarks").glob("*.py"))
    builders = sorted(str(p.relative_to(ROOT)) for p in sources if _constructs_the_loop(p))
    assert builders == ["lightning_fl/cli_fit.py"]


def test_the_grep_finds_a_second_builder(tmp_path) -> None:
    extra = tmp_path / "extra.py"
    extra.write_text('"""FederatedLoop(model, data) in a docstring is no call."""\nloop = FederatedLoop(model, dm)\n')
    assert _constructs_the_loop(extra)
    extra.write_text('"""FederatedLoop(model, data) in a docstring is no call."""\n')
    assert not _constructs_the_loop(extra)


def _calls_a_loaded_class(path: Path) -> list[int]:
    """Lines that call a class named by a class path themselves (``load_class(p)(...)``, or ``t = load_class(p)``
    then ``t(...)``) instead of handing the entry to jsonargparse."""
    tree = ast.parse(path.read_text())

    def loads(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "load_class"

    loaded = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and loads(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (loads(node.func) or (isinstance(node.func, ast.Name) and node.func.id in loaded))
    ]


def test_every_class_path_is_made_by_jsonargparse() -> None:
    """One class_path builder: no module calls a class it loaded from a class path; ``lightning_fl.config.build``
    and the fit command's parser hand every entry to jsonargparse."""
    sources = [*sorted((ROOT / "lightning_fl").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))]
    offenders = {str(p.relative_to(ROOT)): lines for p in sources if (lines := _calls_a_loaded_class(p))}
    assert offenders == {}


def test_the_class_path_check_finds_a_hand_made_entry(tmp_path) -> None:
    source = tmp_path / "builder.py"
    source.write_text("kind = load_class(entry['class_path'])\nobj = kind(**entry['init_args'])\n")
    assert _calls_a_loaded_class(source) == [2]
    source.write_text("obj = load_class(path)(x=1)\nsig = inspect.signature(load_class(path))\n")
    assert _calls_a_loaded_class(source) == [1]


_USER = {
    "data": {"dataset": {"class_path": "tests.user_project.DigitsDataModule"}, "num_clients": 2, "partition": "iid"},
    "model": {"class_path": "tests.user_project.DigitsNet"},
    "loop": {"num_rounds": 1, "trainer": {"accelerator": "cpu"}},
}


def test_builds_share_one_parser_and_one_config_leaves_nothing_in_it_for_the_next(
    tmp_path, built_loops, monkeypatch
) -> None:
    """The bench builds every run with one cached fit parser: a config's model arguments, defences and loop
    settings must not reach the next config (each is built as a fresh parser builds it), and the command's own
    parser (to which ``--ckpt_path`` is added) is never the cached one."""
    from lightning_fl import cli_fit
    from lightning_fl.cli_parsers import SUBCOMMANDS

    fresh_builds: list[int] = []
    fit_parser = cli_fit.fit_parser
    monkeypatch.setattr(cli_fit, "fit_parser", lambda: fresh_builds.append(1) or fit_parser())
    cli_fit._build_parser.cache_clear()
    first = {**_USER, "model": {**_USER["model"], "init_args": {"lr": 0.2, "channels": 4}}}
    first["defences"], first["loop"] = FIT["defences"], {**_USER["loop"], "num_rounds": 3, "vectorize": "off"}
    for config in (first, FIT, _USER):
        cli_fit.build_fit_loop({"seed_everything": 0, **config}, tmp_path)
    assert len(fresh_builds) == 1  # one parser for the three builds
    assert (
        SUBCOMMANDS["test"]() is not cli_fit._build_parser()
        and "ckpt_path" not in cli_fit._build_parser().get_defaults()
    )
    cli_fit._build_parser.cache_clear()  # the last config again, on a parser that never saw the first two
    cli_fit.build_fit_loop({"seed_everything": 0, **_USER}, tmp_path)
    after_others, alone = built_loops[2], built_loops[3]
    assert after_others["model"][1]["lr"] == 0.05 and after_others["model"][1]["channels"] == 8  # its own defaults
    for key in ("model", "defences", "settings", "vectorize", "links", "clients"):
        assert after_others[key] == alone[key], key
    assert after_others["defences"] == [] and after_others["settings"][0] == 1 and after_others["vectorize"] == "auto"
