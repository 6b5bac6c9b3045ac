"""Every setting ``tierlog serve`` accepts is documented, and every documented setting is
accepted: the TOML blocks of ``docs/*.md`` are compared with the config's sections.

A key counts as documented where a ```toml block of any page shows it under its
``[section]`` header (with its default and a comment saying what it does)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from tierlog.server.config import ServerConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"


def accepted() -> set[str]:
    defaults = ServerConfig()
    return {
        f"{section.name}.{key.name}"
        for section in dataclasses.fields(ServerConfig)
        for key in dataclasses.fields(getattr(defaults, section.name))
    }


def documented() -> dict[str, str]:
    found: dict[str, str] = {}
    for page in sorted(DOCS.glob("*.md")):
        for block in re.findall(r"```toml\n(.*?)```", page.read_text(), re.S):
            section = None
            for line in block.splitlines():
                header = re.match(r"\s*\[([a-z_]+)\]", line)
                if header:
                    section = header.group(1)
                    continue
                key = re.match(r"\s*([a-z_0-9]+)\s*=", line)
                if key and section is not None:
                    found.setdefault(f"{section}.{key.group(1)}", page.name)
    return found


def test_every_accepted_setting_is_documented() -> None:
    missing = sorted(accepted() - set(documented()))
    assert not missing, "settings no docs/*.md TOML block shows:\n" + "\n".join(missing)


def test_every_documented_setting_is_accepted() -> None:
    docs = documented()
    unknown = sorted(f"{k} ({docs[k]})" for k in set(docs) - accepted())
    assert not unknown, "documented settings the config does not accept:\n" + "\n".join(unknown)
