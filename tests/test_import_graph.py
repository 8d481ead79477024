"""The package's import graph has no circle (between modules, and between packages counting what ``__init__`` files
import), plug-ins never import the federation, no part of the federation but ``loop.py`` receives the loop or builds
the run's collaborators, ``loop.py`` is an assembler of at most 250 lines, and no object writes into a step
object or another collaborator of the loop (a mailbox).

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


def _called(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _calls(tree: ast.AST) -> set[str]:
    """What ``tree`` calls, counting ``functools.partial(X, ...)`` as a call of ``X``."""
    calls = {_called(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    partials = {
        _called(node.args[0])
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _called(node.func) == "partial" and node.args
    }
    return (calls | partials) - {None}


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


def _package(module: str, modules: dict[str, Path]) -> str:
    """The top-level part of the package a module belongs to: ``lightning_fl.defences.dp.fed_cdp`` is in
    ``lightning_fl.defences``; a top-level module (``lightning_fl.cli``) is its own part."""
    return ".".join(module.split(".")[:2])


def _package_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if name == "lightning_fl":  # the root re-exports everything: it is the package, not a part of it
            continue
        mine = _package(name, modules)
        found = {_package(t, modules) for t in _imports(name, path, modules)} - {mine, "lightning_fl"}
        graph.setdefault(mine, set()).update(found)
    return graph


def test_no_circle_between_packages_counting_what_init_files_import() -> None:
    graph = _package_graph()
    assert {"lightning_fl.attacks", "lightning_fl.defences", "lightning_fl.federation"} <= set(graph)
    assert _circles(graph) == []


ALLOWED_FEDERATION_IMPORTERS = (
    "lightning_fl.cli",
    "lightning_fl.cli_parsers",
    "lightning_fl.bench",
    "lightning_fl.flower",
)
"""Who may import :mod:`lightning_fl.federation` from outside it: the command (its parsers), the bench and the Flower
adapter, which run federations; the package root re-exports the public API."""


def test_only_the_command_the_bench_and_flower_import_the_federation() -> None:
    modules = _modules()
    offenders = sorted(
        name
        for name, path in modules.items()
        if not name.startswith("lightning_fl.federation")
        and name != "lightning_fl"
        and not name.startswith(ALLOWED_FEDERATION_IMPORTERS)
        and any(t.startswith("lightning_fl.federation") for t in _imports(name, path, modules))
    )
    assert offenders == []


CONCRETE_PLUGINS = {"PrivacyBudget", "PaillierEncryption", "SecureFedAvg", "SecAggMasking", "MaliciousImprint"}


def test_the_federation_asks_plug_ins_for_capabilities_not_their_types() -> None:
    """Composition asks what a plug-in declares (``encrypts``, ``needs_privacy_ledger``, ...), never its class."""
    offenders = []
    for path in sorted((PACKAGE / "federation").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightning_fl."):
                named = {a.name for a in node.names} & CONCRETE_PLUGINS
                offenders += [f"{path.name}:{node.lineno} imports {n}" for n in sorted(named)]
    assert offenders == []


def test_a_malicious_server_is_a_server_plug_in_not_a_defence() -> None:
    from lightning_fl.attacks import MaliciousImprint
    from lightning_fl.defences import Defence
    from lightning_fl.transforms import ServerPlugin

    assert issubclass(MaliciousImprint, ServerPlugin) and not issubclass(MaliciousImprint, Defence)


def test_loop_py_is_an_assembler_of_at_most_250_lines() -> None:
    """Every line counts, docstrings too: the settings' meaning lives in ``loop_settings.py`` (``--help`` reads it)."""
    assert len((PACKAGE / "federation" / "loop.py").read_text().splitlines()) <= 250


def test_every_loop_setting_has_its_own_line_where_help_reads_it() -> None:
    """Each setting of ``FederatedLoop`` has a description in the docstring that ``lightning-fl fit --help`` parses
    (``FederatedLoop.__doc__``, from ``loop_settings.py``): two settings packed on one line show one of them."""
    import inspect

    import docstring_parser

    from lightning_fl.federation.loop import FederatedLoop

    described = {p.arg_name for p in docstring_parser.parse(FederatedLoop.__doc__ or "").params if p.description}
    assert set(inspect.signature(FederatedLoop).parameters) - described == set()


def _loop_handles(tree: ast.AST) -> set[str]:
    """The attributes under which ``FederatedLoop`` keeps the collaborators it builds (``self.x = Class(...)``)."""
    handles = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "FederatedLoop":
            for assign in (n for n in ast.walk(node) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)):
                built = _called(assign.value.func)
                for target in assign.targets:
                    targets = target.elts if isinstance(target, ast.Tuple) else [target]
                    handles |= {
                        t.attr
                        for t in targets
                        if isinstance(t, ast.Attribute)
                        and ast.unparse(t.value) == "self"
                        and built
                        and built[0].isupper()
                    }
    return handles


def _mailboxes(tree: ast.AST, handles: set[str]) -> list[str]:
    """Writes into an attribute of a collaborator the loop built (``self.clock.touched = ...``), also through a
    local name bound to one (``step = self.client_step; step.x = ...``)."""
    aliases = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr in handles
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return [
        f"{line}: {owner}.{attribute}"
        for line, owner, attribute in _writes(tree)
        if owner != "self" and owner.rpartition(".")[2] in handles | aliases
    ]


def test_no_object_writes_into_a_collaborator_of_the_loop() -> None:
    loop_tree = ast.parse((PACKAGE / "federation" / "loop.py").read_text())
    handles = _loop_handles(loop_tree)
    assert {"runner", "client_step", "server_step", "rounds", "view", "evaluator"} <= handles
    offenders = []
    for path in sorted([*(PACKAGE / "federation").glob("*.py"), PACKAGE / "flower.py"]):
        offenders += [f"{path.name}:{m}" for m in _mailboxes(ast.parse(path.read_text()), handles)]
    assert offenders == []


MAILBOX = """
class FederatedLoop:
    def __init__(self):
        self.clock = RoundClock()
        self.client_step = ClientStep()

    def run_round(self):
        self.clock.touched = [0]
        step = self.client_step
        step.offsets = {}
"""


def test_the_mailbox_check_finds_a_reintroduced_mailbox() -> None:
    tree = ast.parse(MAILBOX)
    assert sorted(_mailboxes(tree, _loop_handles(tree))) == ["10: step.offsets", "8: self.clock.touched"]
