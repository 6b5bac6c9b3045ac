"""``docs/design.md`` describes HEAD: a row for every package and every ``server/`` file.

The page is where a reader learns what each package and each file of the protocol front
holds; a package or a ``server/`` file added without a row, or a row (or a file a row
names) left behind after a move, makes the page describe code that is not there. The
tables are parsed from the page itself, as ``test_layers.py`` parses the layer list.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "tierlog"
DESIGN = ROOT / "docs" / "design.md"

ROW = re.compile(r"^\| `([^`]+)` \|(.*)\|\s*$", re.M)
FILE = re.compile(r"`([a-z_/]+\.py)(?::[A-Za-z_.]+)?`")


def section(title: str) -> str:
    text = DESIGN.read_text()
    assert f"\n{title}\n" in text, f"docs/design.md has no section {title!r}"
    return text.split(f"\n{title}\n", 1)[1].split("\n#", 1)[0]


def rows(title: str) -> dict[str, str]:
    """First column -> the rest of each table row under ``title``."""
    return {m.group(1): m.group(2) for m in ROW.finditer(section(title))}


def packages() -> set[str]:
    return {p.parent.name for p in SRC.glob("*/__init__.py")}


def server_files() -> set[str]:
    server = SRC / "server"
    return {
        p.relative_to(server).as_posix() for p in server.rglob("*.py") if p.name != "__init__.py"
    }


def test_a_row_for_every_package_and_no_other() -> None:
    listed = set(rows("## Packages"))
    assert listed - packages() == set(), "rows for packages that do not exist"
    assert packages() - listed == set(), "packages without a row in docs/design.md"


def test_files_named_in_package_rows_exist() -> None:
    missing = []
    for package, text in rows("## Packages").items():
        if package == "server":
            continue  # its files have their own table
        for name in FILE.findall(text):
            if not (SRC / package / name).exists() and not list((SRC / package).rglob(name)):
                missing.append(f"{package}: {name}")
    assert not missing, f"docs/design.md names files that do not exist: {missing}"


def test_a_row_for_every_server_file_and_no_other() -> None:
    listed = set(rows("### `server/` files"))
    assert listed - server_files() == set(), "rows for server/ files that do not exist"
    assert server_files() - listed == set(), "server/ files without a row in docs/design.md"


def test_rule_homes_exist() -> None:
    """Every ``package/file.py`` a rule names as its home is there."""
    names = FILE.findall(section("## Rules that live in exactly one place"))
    assert names, "no file found in the rules table"
    missing = [
        name
        for name in names
        if not (ROOT / name if name.startswith("tests/") else SRC / name).exists()
    ]
    assert not missing, f"rule homes that do not exist: {missing}"
