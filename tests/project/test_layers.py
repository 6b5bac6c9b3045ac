"""Every import in ``src/tierlog`` follows the layer order written in ``docs/design.md``.

The layer list is parsed from the document itself, so the page and the check cannot drift.
Imports inside functions count: a deferred import is still a dependency.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "tierlog"
DESIGN = ROOT / "docs" / "design.md"


def layers() -> dict[str, int]:
    """Top-level package or module name → layer number, from the numbered list."""
    text = DESIGN.read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    result: dict[str, int] = {}
    for match in re.finditer(r"^(\d+)\. ((?:`[a-z_]+` ?)+)", section, re.M):
        for name in re.findall(r"`([a-z_]+)`", match.group(2)):
            result[name] = int(match.group(1))
    return result


def top_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def imported_tops(tree: ast.AST, module_parts: tuple[str, ...]) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "tierlog" and len(parts) > 1:
                    found.append((node.lineno, parts[1]))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = module_parts[: len(module_parts) - node.level]
                parts = [*base, *(node.module.split(".") if node.module else [])]
            else:
                parts = node.module.split(".") if node.module else []
                if not parts or parts[0] != "tierlog":
                    continue
                parts = parts[1:]
            if parts:
                found.append((node.lineno, parts[0]))
            else:  # from tierlog import x
                found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def violations() -> list[str]:
    order = layers()
    problems: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == SRC:
            continue
        own = top_of(path)
        if own not in order:
            problems.append(f"{path.relative_to(SRC)}: package {own!r} is not in docs/design.md")
            continue
        parts = path.relative_to(SRC).with_suffix("").parts
        tree = ast.parse(path.read_text(), str(path))
        for lineno, target in imported_tops(tree, parts):
            if target == own or target == "__version__":
                continue
            if target not in order:
                problems.append(f"{path.relative_to(SRC)}:{lineno}: imports unknown {target!r}")
            elif order[target] >= order[own]:
                problems.append(
                    f"{path.relative_to(SRC)}:{lineno}: {own} (layer {order[own]}) imports "
                    f"{target} (layer {order[target]})"
                )
    return problems


def test_the_layer_list_is_parsed() -> None:
    order = layers()
    assert order["formats"] < order["storage"] < order["log"] < order["remote"]
    assert order["remote"] < order["tiering"] < order["server"] < order["spark"]
    assert order["tiering"] == order["read"]


def test_every_import_follows_the_layer_order() -> None:
    assert violations() == []


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    source = "def f():\n    from tierlog.server.broker import Broker\n"
    tree = ast.parse(source)
    assert imported_tops(tree, ("log", "writer")) == [(2, "server")]
