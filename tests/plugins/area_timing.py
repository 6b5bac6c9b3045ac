"""Time per test area, slowest first, printed at the end of every run.

An area is the first path component under ``tests/`` (a package such as ``tests/log/``)
or, for a module directly under ``tests/``, the module itself. CI keeps each area's share
small; this table is how a growing area is noticed.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

_durations: dict[str, float] = defaultdict(float)
_counts: dict[str, int] = defaultdict(int)


def _area(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if parts and parts[0] == "tests":
        parts = parts[1:]
    if len(parts) > 1:
        return parts[0]
    return parts[0].removesuffix(".py") if parts else path


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    area = _area(report.nodeid)
    _durations[area] += report.duration
    if report.when == "call":
        _counts[area] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _durations:
        return
    terminalreporter.write_sep("=", "time per test area (setup + call + teardown), slowest first")
    total = sum(_durations.values())
    for area, seconds in sorted(_durations.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {_counts[area]:5d} tests  {area}")
    terminalreporter.write_line(f"{total:8.1f} s  total")
