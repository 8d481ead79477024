"""Benchmark scripts time and steer the loop through its public hooks (FL callbacks, selectors, ``loop.trainer``
options), never by patching it: no file in ``benchmarks/`` assigns to an attribute of a ``lightning_fl`` module,
class or object it did not create itself.

A name counts as ``lightning_fl``'s when it is imported from the package, or bound to what a call of such a name
returns (``loop = build_loop(...)``, ``model = ImageClassifier(...)``). Writing a first-level attribute of an object
the script built (``attack.progress_bar = False`` on its own attack) is allowed; writing deeper
(``loop.runner.fit = ...``: the runner is the loop's), into a ``lightning_fl`` module or class (``Round.run = ...``),
into an object a ``lightning_fl`` factory returned (``build_loop``), or through ``setattr`` on anything but ``self``
is not.
"""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def _root(node: ast.expr) -> tuple[str | None, int]:
    """The name an attribute chain starts from and the chain's depth (``a.b.c``: ``("a", 2)``)."""
    depth = 0
    while isinstance(node, ast.Attribute):
        node, depth = node.value, depth + 1
    while isinstance(node, ast.Subscript | ast.Call):  # loop.clients[0].x, f().x: what they reach is not theirs
        node, depth = (node.value if isinstance(node, ast.Subscript) else node.func), depth + 1
        while isinstance(node, ast.Attribute):
            node, depth = node.value, depth + 1
    return (node.id if isinstance(node, ast.Name) else None), depth


def _imported(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightning_fl"):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("lightning_fl")}
    return names


def _bound_from(tree: ast.AST, imported: set[str]) -> tuple[set[str], set[str]]:
    """Names bound to the result of calling an imported ``lightning_fl`` class (``built``) or function (``made``)."""
    built, made = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Call):
            callee, _ = _root(node.value.func)
            if callee not in imported:
                continue
            name = node.value.func.attr if isinstance(node.value.func, ast.Attribute) else callee
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(t, ast.Name):
                        (built if name[:1].isupper() else made).add(t.id)
    return built, made


def patches(source: str) -> list[str]:
    """The attribute writes of ``source`` into what ``lightning_fl`` owns (see the module docstring)."""
    tree = ast.parse(source)
    imported = _imported(tree)
    built, made = _bound_from(tree, imported)
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [
                t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])
            ]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            owner = node.args[0] if node.args else None
            if not (isinstance(owner, ast.Name) and owner.id == "self"):
                found.append(f"{node.lineno}: setattr({ast.unparse(owner) if owner else ''}, ...)")
            continue
        for target in (t for t in targets if isinstance(t, ast.Attribute)):
            root, depth = _root(target)
            theirs = root in imported or root in made
            if theirs or (root in built and depth > 1):
                found.append(f"{node.lineno}: {ast.unparse(target)}")
    return sorted(found)


def test_no_benchmark_patches_the_package() -> None:
    offenders = {path.name: patches(path.read_text()) for path in sorted(BENCHMARKS.glob("*.py"))}
    assert {name: found for name, found in offenders.items() if found} == {}


PATCHING = """
import time
from lightning_fl.bench import build_loop
from lightning_fl.federation import client_runner
from lightning_fl.federation.round import Round
from lightning_fl.attacks import DLGAttack

loop = build_loop(spec, out)
attack = DLGAttack(max_iterations=2)
attack.progress_bar = False
loop.runner.fit = timed(loop.runner.fit)
loop.round_idx = 3
client_runner.build_trainer = timed(client_runner.build_trainer)
Round.run = timed(Round.run)
setattr(loop, "_evaluate", timed)
start = time.perf_counter()
"""


def test_the_check_finds_each_kind_of_patch() -> None:
    assert patches(PATCHING) == [
        "11: loop.runner.fit",
        "12: loop.round_idx",
        "13: client_runner.build_trainer",
        "14: Round.run",
        "15: setattr(loop, ...)",
    ]
