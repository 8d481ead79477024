"""`make reproduce` lists every table's command: each script and config a doc quotes runs in a reproduce-* target,
and every script in benchmarks/ is quoted by some doc (a script no table quotes is deleted, not kept)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = re.compile(r"benchmarks/([a-z0-9_]+\.(?:py|sh))")
CONFIG_COMMAND = re.compile(r"lightning-fl (?:fit|attack|bench)\b[^`\n]*?(?:--config|-c) configs/([a-z0-9_{},]+)\.yaml")
NOT_REPRODUCED = {"bench_cifar10": "needs CIFAR-10 on disk (--data.root); the project ships no CIFAR data"}
"""Configs a doc quotes whose command `make reproduce` cannot run, and why."""


def _expand(name: str) -> list[str]:
    """``robbing_the_fed_{digits,photos}`` -> both names (the docs' brace shorthand)."""
    parts = re.split(r"\{([^}]*)\}", name)
    choices = [part.split(",") if i % 2 else [part] for i, part in enumerate(parts)]
    return ["".join(p) for p in itertools.product(*choices)]


def _docs() -> str:
    return "\n".join(path.read_text() for path in sorted((ROOT / "docs").glob("*.md")))


def _reproduce_recipes(makefile: str) -> str:
    """The recipe lines of every ``reproduce-*`` target of the Makefile."""
    recipes, inside = [], False
    for line in makefile.splitlines():
        if re.match(r"^reproduce-[a-z0-9-]+:", line):
            inside = True
        elif line and not line.startswith(("\t", "#")):
            inside = False
        elif inside:
            recipes.append(line)
    return "\n".join(recipes)


def _is_script(path: Path) -> bool:
    """A command of its own: a shell script or a Python file run as ``__main__`` (not a helper module)."""
    return path.suffix == ".sh" or 'if __name__ == "__main__":' in path.read_text()


def quoted_scripts(docs: str) -> set[str]:
    return {name for name in SCRIPT.findall(docs) if _is_script(ROOT / "benchmarks" / name)}


def quoted_configs(docs: str) -> set[str]:
    return {name for raw in CONFIG_COMMAND.findall(docs) for name in _expand(raw)} - set(NOT_REPRODUCED)


def missing_from_reproduce(docs: str, makefile: str) -> list[str]:
    """What ``docs`` quote that no reproduce-* recipe of ``makefile`` runs."""
    recipes = _reproduce_recipes(makefile)
    scripts = [f"benchmarks/{name}" for name in quoted_scripts(docs) if f"benchmarks/{name}" not in recipes]
    configs = [f"configs/{name}.yaml" for name in quoted_configs(docs) if f"configs/{name}.yaml" not in recipes]
    return sorted(scripts + configs)


def test_every_quoted_command_is_in_make_reproduce() -> None:
    missing = missing_from_reproduce(_docs(), (ROOT / "Makefile").read_text())
    assert not missing, f"docs quote these but no reproduce-* target of the Makefile runs them: {missing}"


def test_the_check_fails_when_a_doc_quotes_a_script_the_makefile_does_not_list() -> None:
    makefile = (ROOT / "Makefile").read_text()
    docs = "Table from `python benchmarks/loop_overhead.py`; `lightning-fl fit --config configs/quickstart.yaml`."
    assert missing_from_reproduce(docs, makefile) == []
    trimmed = makefile.replace("benchmarks/loop_overhead.py", "benchmarks/elsewhere.py")
    trimmed = trimmed.replace("configs/quickstart.yaml", "configs/other.yaml")
    assert missing_from_reproduce(docs, trimmed) == ["benchmarks/loop_overhead.py", "configs/quickstart.yaml"]


SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in {".py", ".sh"} and p.name[0] != "_")
"""The files of benchmarks/ (``_config.py`` and ``_timing.py`` are helpers the scripts import)."""


@pytest.mark.parametrize("path", SCRIPTS, ids=str)
def test_every_benchmark_script_is_quoted_by_a_doc(path: str) -> None:
    docs = _docs() + (ROOT / "README.md").read_text()
    assert f"benchmarks/{path}" in docs, f"benchmarks/{path}: no doc quotes it; quote its table or delete it"


def test_brace_shorthand_expands() -> None:
    assert _expand("robbing_the_fed_{digits,photos}") == ["robbing_the_fed_digits", "robbing_the_fed_photos"]
    assert _expand("{dlg,idlg,ig}_lenet_digits") == ["dlg_lenet_digits", "idlg_lenet_digits", "ig_lenet_digits"]


def test_make_reproduce_runs_every_reproduce_target_but_the_ones_needing_outside_hardware_or_code() -> None:
    makefile = (ROOT / "Makefile").read_text()
    listed = re.search(r"^REPRODUCE := (.*?)\n(?!\t)", makefile, flags=re.M | re.S).group(1).replace("\\", " ").split()
    defined = re.findall(r"^(reproduce-[a-z0-9-]+):", makefile, flags=re.M)
    assert sorted(set(defined) - set(listed)) == ["reproduce-breaching", "reproduce-gpu"]
    assert set(listed) <= set(defined), f"REPRODUCE names targets with no rule: {sorted(set(listed) - set(defined))}"
