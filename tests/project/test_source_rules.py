"""Docstrings and comments in ``src/`` say the rule itself or point inside the repository.

A reference to a file outside the repository (a design note, a spec seed, a shared
directory) or to an issue number means nothing to a reader of the code, and goes stale
when the outside file moves. Where a pointer helps, it names a page under ``docs/``,
and that page must exist.

Each package declares the errors it raises in its own ``errors.py``, so a caller finds
every error a package can raise in one place.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "tierlog"

OUTSIDE_REFERENCES = {
    "a design note outside the repository": re.compile(r"\bDESIGN\.md\b"),
    "a spec seed": re.compile(r"\bseeds?(?: \d{2,}|/)", re.IGNORECASE),
    "an issue number": re.compile(r"\b(?:issue|ticket|PR)\s*#?\d+", re.IGNORECASE),
    "a bare issue reference": re.compile(r"(?<![\w&/])#\d{1,4}\b(?![\w-])"),
    "a shared directory outside the repository": re.compile(r"(?:\.\./|/work/)shared\b"),
}
DOCS_REFERENCE = re.compile(r"\bdocs/([\w./-]+\.md)\b")


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _findings(text: str) -> list[str]:
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for what, pattern in OUTSIDE_REFERENCES.items():
            match = pattern.search(line)
            if match:
                found.append(f"line {lineno}: {what}: {match.group(0)!r}")
    return found


def test_sources_are_found() -> None:
    assert len(_sources()) > 50


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see DESIGN.md", 1),
        ("(seed 000)", 1),
        ("as ../shared/seeds/ says", 2),
        ("what issue 5 asks", 1),
        ("fixed in issue #12", 2),
        ("see #42", 1),
        ("random.Random(seed)", 0),
        ("the offset 12 is in docs/design.md", 0),
        ('colour = "#fff"', 0),
        ("x = a[1]  # 3 fields", 0),
    ],
)
def test_the_rule_catches_outside_references(text: str, expected: int) -> None:
    assert len(_findings(text)) == expected, _findings(text)


def test_no_source_points_outside_the_repository() -> None:
    bad = [
        f"{path.relative_to(ROOT)} {finding}"
        for path in _sources()
        for finding in _findings(path.read_text(encoding="utf-8"))
    ]
    assert not bad, "references outside the repository:\n" + "\n".join(bad)


def test_docs_pages_named_in_sources_exist() -> None:
    missing = [
        f"{path.relative_to(ROOT)}: docs/{name}"
        for path in _sources()
        for name in DOCS_REFERENCE.findall(path.read_text(encoding="utf-8"))
        if not (ROOT / "docs" / name).is_file()
    ]
    assert not missing, "docs pages that do not exist:\n" + "\n".join(missing)


def _error_classes_outside_errors_modules(path: Path) -> list[str]:
    """Exception classes (named ``...Error``, based on an error) not in an ``errors.py``."""
    if path.name == "errors.py":
        return []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef) or not node.name.endswith("Error"):
            continue
        bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
        if any(b.endswith(("Error", "Exception")) for b in bases):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    return found


def test_every_error_class_lives_in_its_packages_errors_module() -> None:
    stray = [hit for path in _sources() for hit in _error_classes_outside_errors_modules(path)]
    assert not stray, "error classes outside errors.py:\n" + "\n".join(stray)
