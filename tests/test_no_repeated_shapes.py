"""No two places in ``attacks/`` or ``server/`` repeat six or more lines of the same shape: a run of consecutive
statements that is the same as another but for its names, attributes and constants (a copy with other names is one
function or one table waiting to be written).

Statements are compared by their syntax tree with every identifier, attribute name, keyword name and constant
replaced by a placeholder, and docstrings dropped; a run counts from the first statement whose lines reach six.
Signatures and comments are not statements, so parameter lists and prose never count; declarations are left out
as signatures are (a dataclass's field annotations, ``__all__`` and other literal tables), and a run that overlaps
itself (six like fields in a row) is one place.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "lightning_fl"
MIN_LINES = 6


class _Shape(ast.NodeTransformer):
    """Replace what a copy renames (identifiers, attributes, keywords, constants) by placeholders."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(id="_", ctx=node.ctx)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        return ast.Attribute(value=self.visit(node.value), attr="_", ctx=node.ctx)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant(value=type(node.value).__name__)

    def visit_keyword(self, node: ast.keyword) -> ast.AST:
        return ast.keyword(arg="_" if node.arg else None, value=self.visit(node.value))

    def visit_arg(self, node: ast.arg) -> ast.AST:
        return ast.arg(arg="_", annotation=self.visit(node.annotation) if node.annotation else None)

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            node.name = "_"
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list):
                setattr(node, field, [s for s in body if not _is_docstring(s)])
        return super().generic_visit(node)


def _is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _declaration(node: ast.stmt) -> bool:
    """A field annotation or a name bound to a literal (a table): data, compared as signatures are not."""
    if isinstance(node, ast.AnnAssign):
        return node.value is None or _literal(node.value)
    return isinstance(node, ast.Assign) and _literal(node.value)


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def _shape(statements: list[ast.stmt]) -> str:
    import copy

    return "\n".join(ast.dump(_Shape().visit(copy.deepcopy(s))) for s in statements)


def _bodies(tree: ast.AST) -> list[list[ast.stmt]]:
    bodies = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                bodies.append(
                    [s for s in body if not _is_docstring(s) and not isinstance(s, ast.Import | ast.ImportFrom)]
                )
    return bodies


def runs(sources: dict[str, str]) -> dict[str, list[str]]:
    """Each shape of a run of consecutive statements spanning at least ``MIN_LINES`` lines that stands in more than
    one place, with its places (``file:first-last``)."""
    places: dict[str, list[str]] = defaultdict(list)
    for name, source in sources.items():
        for body in _bodies(ast.parse(source)):
            for start, first in enumerate(body):
                for end in range(start, len(body)):
                    if (body[end].end_lineno or body[end].lineno) - first.lineno + 1 >= MIN_LINES:
                        run = body[start : end + 1]
                        if not all(_declaration(s) for s in run):
                            places[_shape(run)].append(f"{name}:{first.lineno}-{body[end].end_lineno}")
                        break
    return {shape: where for shape, where in places.items() if len(where) > 1 and not _nested(where)}


def _nested(where: list[str]) -> bool:
    """Whether the places are one run seen more than once (a statement and the body that holds it, or a run of like
    statements that overlaps itself)."""
    spans = [(w.rpartition(":")[0], *map(int, w.rpartition(":")[2].split("-"))) for w in where]
    return all(a[0] == b[0] and a[1] <= b[2] and b[1] <= a[2] for a in spans for b in spans)


def test_attacks_and_server_repeat_no_six_lines_of_the_same_shape() -> None:
    sources = {
        str(path.relative_to(PACKAGE)): path.read_text()
        for folder in ("attacks", "server")
        for path in sorted((PACKAGE / folder).rglob("*.py"))
    }
    assert len(sources) > 30
    assert sorted(runs(sources).values()) == []


ORIGINAL = """
def one(model, data):
    loss = model(data.x)
    loss.backward()
    total = loss.item() * 2
    print("one", total)
    if total > 3:
        return total
    return 0.0
"""

RENAMED = {"one": "two", "model": "net", "data": "batch", "loss": "cost", "total": "summed", "2": "5", "3": "1"}


def _renamed(source: str) -> str:
    for old, new in RENAMED.items():
        source = source.replace(old, new)
    return source


def test_the_check_finds_a_copy_with_other_names() -> None:
    copied = ORIGINAL + "\n" + _renamed(ORIGINAL)
    assert "def two(net, batch)" in copied
    assert sorted(runs({"copied.py": copied}).values())[0] == ["copied.py:2-9", "copied.py:12-19"]
