"""The documentation site (mkdocs.yml): its API reference covers every public class and function of the package,
and every page under docs/ is in its navigation (CI builds it with ``mkdocs build --strict``)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import yaml

import lightning_fl

REPO = Path(__file__).parents[1]


def _nav_pages(entries: list) -> set[str]:
    pages: set[str] = set()
    for entry in entries:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def _site() -> dict:
    return yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)


def test_the_reference_documents_every_public_class_and_function() -> None:
    documented = set()
    for page in (REPO / "docs" / "reference").glob("*.md"):
        documented |= set(re.findall(r"^::: (\S+)$", page.read_text(), flags=re.MULTILINE))
    public = {
        f"{obj.__module__}.{obj.__qualname__}"
        for obj in (getattr(lightning_fl, name) for name in lightning_fl.__all__)
        if inspect.isclass(obj) or inspect.isfunction(obj)
    }
    missing = sorted(public - documented)
    assert len(public) > 100 and missing == [], f"add a line '::: PATH' to a page of docs/reference/ for {missing}"


def test_every_page_is_in_the_navigation() -> None:
    docs = REPO / "docs"
    pages = {str(p.relative_to(docs)) for p in docs.rglob("*.md")}
    nav = _nav_pages(_site()["nav"])
    assert sorted(pages - nav) == [] and sorted(nav - pages) == []
    assert {"index.md", "reference/federation.md", "tutorials/attack-your-model.md", "bench.md"} <= nav
