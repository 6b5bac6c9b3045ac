"""Reading tierlog's structured log events back from captured log records (``caplog``).

tierlog hands finished lines to stdlib logging (logfmt by default, JSON under
``log_format="json"``); tests look at events by name and compare their fields."""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Iterable
from typing import Any


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields of one rendered event line (values as rendered: strings under logfmt)."""
    line = record.getMessage()
    if line.startswith("{"):
        parsed: dict[str, Any] = json.loads(line)
        return parsed
    return dict(part.split("=", 1) for part in shlex.split(line) if "=" in part)


def events(records: Iterable[logging.LogRecord], name: str) -> list[dict[str, Any]]:
    """The fields of every captured event called ``name``, in order."""
    found = []
    for record in records:
        try:
            parsed = fields(record)
        except ValueError:
            continue  # not a tierlog line
        if parsed.get("event") == name:
            found.append(parsed)
    return found
