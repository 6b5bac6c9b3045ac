"""Only the tierlog.metrics package (src/tierlog/metrics/) formats metrics and only
tierlog/logs.py formats log records: every log call elsewhere is an event name (a
snake_case literal) plus keyword fields, no module sets up stdlib logging itself, and no
Prometheus text is assembled by hand."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "tierlog"
LEVELS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log", "msg"}
EVENT = re.compile(r"^[a-z][a-z0-9_]*$")
METRICS = SRC / "metrics"
LOGGER_NAMES = {"log", "logger", "_log", "LOG", "_logger", "logging", "structlog"}


def sources() -> list[Path]:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 50
    return files


def _is_log_call(node: ast.Call) -> bool:
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr not in LEVELS:
        return False
    target = func.value
    while isinstance(target, ast.Attribute):  # self.log.info(...)
        if target.attr in LOGGER_NAMES:
            return True
        target = target.value
    return isinstance(target, ast.Name) and target.id in LOGGER_NAMES


def test_every_log_call_is_an_event_with_fields() -> None:
    bad: list[str] = []
    calls = 0
    for path in sources():
        if path.name == "logs.py" and path.parent == SRC:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and _is_log_call(node)):
                continue
            calls += 1
            where = f"{path.relative_to(SRC)}:{node.lineno}"
            args = node.args
            if (
                len(args) != 1
                or not isinstance(args[0], ast.Constant)
                or not isinstance(args[0].value, str)
                or not EVENT.match(args[0].value)
            ):
                bad.append(f"{where}: first argument must be a snake_case event name only")
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id in ("logging", "structlog")
            ):
                bad.append(f"{where}: module-level logging call, use get_logger()")
    assert calls > 30
    assert not bad, "\n".join(bad)


def test_loggers_come_from_tierlog_logs() -> None:
    bad = []
    for path in sources():
        if path.name == "logs.py" and path.parent == SRC:
            continue
        text = path.read_text()
        for pattern in (
            r"logging\.getLogger",
            r"structlog\.",
            r"logging\.(Formatter|StreamHandler|basicConfig)",
            r"^import structlog",
        ):
            for m in re.finditer(pattern, text, flags=re.M):
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{path.relative_to(SRC)}:{line}: {m.group(0)}")
    assert not bad, "\n".join(bad)


def test_no_hand_made_prometheus_text() -> None:
    bad = []
    for path in sources():
        if path.parent == METRICS:
            continue
        text = path.read_text()
        for pattern in (
            r"# (HELP|TYPE) ",
            r"_bucket\{",
            r'le="',
            r"text/plain; version=0\.0\.4",
            r"\bprometheus_client\b",
        ):
            for m in re.finditer(pattern, text):
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{path.relative_to(SRC)}:{line}: {m.group(0)}")
    assert not bad, "\n".join(bad)
