"""Stream directory names: ``{vhost}_{name}_{created-timestamp-ns}``, as RabbitMQ makes them.

RabbitMQ builds the string ``vhost_name_timestamp`` and maps it with Osiris's
``to_base64uri`` (``/`` becomes ``_``, ``+`` becomes ``-``), so the default vhost
``/`` gives directories like ``__orders_1700000000000000000``. tierlog does the same
for the vhost; stream names themselves must be plain file-name material. The result
must never escape the data directory.

Also the one rule for names the server keeps for itself (``RESERVED_PREFIX``): it lives
here, in the lowest layer that knows stream names, so the server's commands and admin
routes and the delayed-delivery service all import the same rule.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from tierlog.log.errors import InvalidStreamNameError, ReservedNameError

MAX_DIR_NAME_BYTES = 255
_DIR_NAME = re.compile(r"^(?P<prefix>.+)_(?P<ts>[0-9]{1,20})$", re.DOTALL)


def _check_text(value: str, what: str) -> None:
    if not isinstance(value, str) or value == "":
        raise InvalidStreamNameError(f"{what} must be a non-empty string")
    if "\x00" in value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise InvalidStreamNameError(f"{what} {value!r} contains NUL or control characters")
    if "\\" in value or ".." in value:
        raise InvalidStreamNameError(f"{what} {value!r} contains '\\\\' or '..'")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_DIR_NAME_BYTES:
        raise InvalidStreamNameError(f"{what} is longer than {MAX_DIR_NAME_BYTES} bytes")


def validate_stream_name(name: str) -> None:
    """Reject stream names that are empty, too long, or could form a path."""
    _check_text(name, "stream name")
    if "/" in name:
        raise InvalidStreamNameError(f"stream name {name!r} contains '/'")
    if name in (".", ".."):
        raise InvalidStreamNameError(f"stream name {name!r} is not allowed")


def validate_vhost(vhost: str) -> None:
    """Reject vhosts that are empty, too long, or could form a path ('/' is mapped to '_')."""
    _check_text(vhost, "vhost")


def validate_dir_name(dir_name: str) -> None:
    """Check a stream directory name: one safe path component, ending in ``_<digits>``."""
    _check_text(dir_name, "stream directory name")
    if "/" in dir_name or dir_name.startswith("."):
        raise InvalidStreamNameError(f"stream directory name {dir_name!r} is not one component")
    if not _DIR_NAME.match(dir_name):
        raise InvalidStreamNameError(
            f"stream directory name {dir_name!r} does not end in _<created-timestamp-ns>"
        )


def stream_dir_name(vhost: str, name: str, created_ns: int | None = None) -> str:
    """Build the directory name ``{vhost}_{name}_{created_ns}`` (vhost '/' and '+' mapped)."""
    validate_vhost(vhost)
    validate_stream_name(name)
    if created_ns is None:
        created_ns = time.time_ns()
    if not isinstance(created_ns, int) or created_ns < 0 or created_ns >= 10**20:
        raise InvalidStreamNameError(f"created timestamp {created_ns!r} is not a valid ns time")
    mapped_vhost = vhost.replace("/", "_").replace("+", "-")
    dir_name = f"{mapped_vhost}_{name}_{created_ns}"
    validate_dir_name(dir_name)
    return dir_name


def created_ns_of(dir_name: str) -> int:
    """The creation timestamp (ns) at the end of a stream directory name."""
    validate_dir_name(dir_name)
    match = _DIR_NAME.match(dir_name)
    assert match is not None
    return int(match.group("ts"))


# ----------------------------------------------------------------- reserved names

RESERVED_PREFIX = "__tierlog"
"""Every name that starts with this belongs to the server: the hidden system streams of
delayed delivery (``__tierlog_delayed.<name>``) and its dispatcher producer
(``__tierlog_delayed_dispatcher``) today, whatever internal stream or producer comes next.
A client may not name a stream, super stream, partition, producer reference or consumer
with it (``check_client_name``); the server's own writes reach such streams and producers
through an internal path no client command has (docs/security.md, "Reserved names")."""

CLIENT_NAME_KINDS = (
    "stream",
    "super stream",
    "partition",
    "producer reference",
    "consumer name",
)
"""What a client names, each checked by the one rule below."""


def is_reserved(name: str | None) -> bool:
    """True for a name with the internal prefix (None and "" are not reserved)."""
    return name is not None and name.startswith(RESERVED_PREFIX)


def check_client_name(kind: str, name: str | None) -> None:
    """Raise ``ReservedNameError`` when a client names a ``kind`` (one of
    ``CLIENT_NAME_KINDS``) with the reserved prefix."""
    if kind not in CLIENT_NAME_KINDS:
        raise ValueError(f"unknown kind of name {kind!r}")
    if name is not None and is_reserved(name):
        raise ReservedNameError(kind, name, RESERVED_PREFIX)


def check_super_stream(name: str, partitions: Sequence[str]) -> None:
    """The rule for CreateSuperStream (and the admin API's creation): the super stream and
    every partition. Route, Partitions and DeleteSuperStream check the super-stream name."""
    check_client_name("super stream", name)
    for partition in partitions:
        check_client_name("partition", partition)
