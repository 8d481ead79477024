"""The package's import graph has no circle, no part of the federation but ``loop.py`` receives the loop or builds
the run's collaborators, and no object writes into a step object.

Every ``import`` counts, also those under ``TYPE_CHECKING`` and inside functions: a circle of type-only imports is
still two modules that each need the other to be read.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "lightning_fl"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""

    def known(target: str) -> str:
        while target not in modules:
            target = target.rpartition(".")[0]
        return target

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {known(a.name) for a in node.names if a.name.startswith("lightning_fl")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])]
                )
            if base.startswith("lightning_fl"):
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else known(base) for a in node.names}
    return found - {name}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, 1972)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def test_the_package_has_no_import_circle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _circles(graph) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_loop_py_in_the_federation_receives_the_loop() -> None:
    offenders = []
    for path in sorted((PACKAGE / "federation").glob("*.py")):
        if path.name in ("loop.py", "__init__.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "lightning_fl.federation.loop":
                offenders.append(f"{path.name} imports the loop")
            if isinstance(node, ast.arg) and (node.arg == "loop" or "FederatedLoop" in ast.unparse(node)):
                offenders.append(f"{path.name}:{node.lineno} takes {ast.unparse(node)}")
    assert offenders == []


ROUND_MODULES = ("round.py", "round_loop.py", "client_round.py", "server_round.py", "updates.py", "leak_points.py")
"""The federation modules a round runs through (``loop.py`` assembles them)."""

COLLABORATORS = {
    "Checkpoint",
    "ClientEvaluation",
    "ClientRunner",
    "ClientStep",
    "ClientStore",
    "Downlink",
    "Evaluator",
    "FederationView",
    "LeakPoints",
    "RankPool",
    "RayPool",
    "Round",
    "RoundLoop",
    "RunLock",
    "RunParts",
    "RunRecorder",
    "ServerStep",
    "VectorisedClients",
    "WorkerPool",
}
"""The long-lived parts of a run; values (results, reports, contexts, messages) are not among them."""

STEP_CLASSES = ("Round", "RoundLoop", "ClientStep", "ServerStep", "Downlink", "LeakPoints")


def _calls(tree: ast.AST) -> set[str]:
    return {
        node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute)
    }


def test_no_module_in_the_round_but_loop_py_builds_collaborators() -> None:
    built = {
        name: sorted(_calls(ast.parse((PACKAGE / "federation" / name).read_text())) & COLLABORATORS)
        for name in ROUND_MODULES
    }
    assert {name: found for name, found in built.items() if found} == {}
    assert {"Round", "RoundLoop", "ClientStep", "ServerStep"} <= _calls(
        ast.parse((PACKAGE / "federation" / "loop.py").read_text())
    )  # the check can fail: loop.py does build them


def _step_attributes() -> set[str]:
    """Every attribute a step class sets on ``self``."""
    names = set()
    for path in (PACKAGE / "federation").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name in STEP_CLASSES:
                names |= {attribute for _, owner, attribute in _writes(node) if owner == "self"}
    return names


def _writes(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, owner, attribute)`` of every attribute assignment and ``setattr`` call in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.append((node.lineno, ast.unparse(node.value), node.attr))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            owner, attribute = node.args[0], node.args[1]
            name = attribute.value if isinstance(attribute, ast.Constant) else ast.unparse(attribute)
            found.append((node.lineno, ast.unparse(owner), str(name)))
    return found


def test_no_object_writes_an_attribute_of_a_step_object() -> None:
    attributes = _step_attributes()
    assert {"client_step", "server_step", "selector", "callbacks"} & attributes  # the check can fail
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, owner, attribute in _writes(ast.parse(path.read_text())):
            if owner != "self" and attribute in attributes:
                offenders.append(f"{path.relative_to(PACKAGE)}:{line} writes {owner}.{attribute}")
    assert offenders == []


def test_a_step_object_writes_its_own_attributes_only_when_it_is_built() -> None:
    offenders = []
    for name in ROUND_MODULES:
        for node in ast.walk(ast.parse((PACKAGE / "federation" / name).read_text())):
            if isinstance(node, ast.ClassDef) and node.name in STEP_CLASSES:
                for method in (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name != "__init__"):
                    writes = [f"self.{a}" for _, owner, a in _writes(method) if owner == "self"]
                    offenders += [f"{name}: {node.name}.{method.name} writes {w}" for w in writes]
    assert offenders == []
