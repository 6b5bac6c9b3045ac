"""Structured logs on ``structlog``: every log call is an event name plus fields.

``log = get_logger(__name__)`` at module level, then
``log.info("segment_rolled", stream=name, segment=first_offset)``: the event is a
snake_case name, never a sentence with values formatted into it, so every line can be
parsed and filtered by field. ``setup_logging`` (called by ``tierlog serve``) chooses the
rendering: ``json`` writes one JSON object per line, ``kv`` writes logfmt
(``ts=… level=info logger=tierlog.server event=listening stream_port=5552``, values with
spaces or quotes quoted and escaped).

tierlog's events are rendered by structlog and handed to the standard ``logging`` module
as finished lines, so they show up correctly under any stdlib handler (tests, embedding
applications); records of other libraries (aiohttp, asyncio) that reach tierlog's handler
are rendered the same way, their message as the event.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO
from urllib.parse import parse_qsl, urlencode, urlsplit

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

LOG_FORMATS = ("kv", "json")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
KEY_ORDER = ["ts", "level", "logger", "event"]
_RENDERED = "tierlog_rendered"
_SECRET_PARAMS = ("secret", "password", "token", "key", "credential", "signature")


def _timestamp(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    now = time.time()
    millis = int(now * 1000) % 1000
    event_dict["ts"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{millis:03d}Z"
    return event_dict


def _kv_renderer() -> Processor:
    return structlog.processors.LogfmtRenderer(key_order=KEY_ORDER, bool_as_flag=False)


def _json_renderer() -> Processor:
    render = structlog.processors.JSONRenderer()

    def ordered(logger: WrappedLogger, method: str, event_dict: EventDict) -> Any:
        head = {k: event_dict.pop(k) for k in KEY_ORDER if k in event_dict}
        return render(logger, method, {**head, **event_dict})

    return ordered


class _Render:
    """The last processor: renders the event and hands the line to stdlib logging,
    marked so tierlog's handler does not render it again. ``setup_logging`` swaps the
    renderer (bound loggers cache their processor chain, this object stays)."""

    def __init__(self) -> None:
        self.renderer: Processor = _kv_renderer()

    def __call__(
        self, logger: WrappedLogger, method: str, event_dict: EventDict
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        line = self.renderer(logger, method, event_dict)
        return (line,), {"extra": {_RENDERED: True}}


_render = _Render()
_PRE_CHAIN: list[Processor] = [
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    _timestamp,
]

_PROCESSORS: list[Processor] = [
    structlog.stdlib.filter_by_level,
    *_PRE_CHAIN,
    structlog.processors.format_exc_info,
    _render,
]


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """The structured logger of a module (``name`` is the stdlib logger name). Built
    with its own processor chain: structlog's global configuration, which an embedding
    application may own, is left alone."""
    logger: structlog.stdlib.BoundLogger = structlog.wrap_logger(
        logging.getLogger(name),
        processors=_PROCESSORS,
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    return logger


class _Formatter(logging.Formatter):
    """Passes tierlog's rendered lines through; renders other libraries' records as events."""

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, _RENDERED, False):
            return record.getMessage()
        event: EventDict = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return str(_render.renderer(None, record.levelname.lower(), event))


def setup_logging(
    log_format: str = "kv", level: str = "info", stream: TextIO | None = None
) -> None:
    """Send every log line to ``stream`` (stderr) in ``log_format``; tierlog's loggers at
    ``level``, other libraries' at warning and above."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {LOG_LEVELS}, got {level!r}")
    _render.renderer = _json_renderer() if log_format == "json" else _kv_renderer()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(_Formatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("tierlog").setLevel(level.upper())


def redact_uri(uri: str) -> str:
    """``uri`` safe to log: a password in the user part and credential-like query
    parameters replaced by ``***``; anything else is left exactly as written."""
    try:
        parts = urlsplit(uri)
        redacted = uri
        if parts.password is not None:
            user, _, host = parts.netloc.rpartition("@")
            netloc = f"{user.split(':', 1)[0]}:***@{host}"
            redacted = redacted.replace(parts.netloc, netloc, 1)
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any(_is_secret(k) for k, _ in pairs):
            query = urlencode([(k, "***" if _is_secret(k) else v) for k, v in pairs], safe="*:/")
            redacted = redacted.replace(parts.query, query, 1)
        return redacted
    except ValueError:
        return "<unparsable uri>"


def _is_secret(name: str) -> bool:
    return any(s in name.lower() for s in _SECRET_PARAMS)
