"""Stream arguments of Create (and the admin API) mapped onto StreamSettings.

RabbitMQ's names keep their meaning: ``max-length-bytes`` and ``max-age`` are the whole
stream's retention (both tiers), ``stream-max-segment-size-bytes`` the local segment
size. tierlog's own settings use ``x-tierlog-*`` names (see docs/server.md). A leading
``x-`` on RabbitMQ names is accepted; ``stream-filter-size-bytes`` is the size of the
chunks' bloom filters (16..255, as RabbitMQ validates it). Arguments RabbitMQ knows but
tierlog has no use for (leader locator; the cluster size is read by ``initial_cluster_size``)
are accepted and ignored; anything else is rejected so a typo never goes unnoticed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tierlog.errors import ConfigError
from tierlog.remote.encryption import process_keyring
from tierlog.remote.settings import StreamSettings, check_index_key, check_new_settings

_UNITS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([YMDhms]?)\s*$")


def parse_duration(text: str) -> float:
    """Seconds from RabbitMQ's ``max-age`` syntax: ``7D``, ``12h``, ``30m``, ``10s``, ``1Y``."""
    match = _DURATION.match(text)
    if not match:
        raise ConfigError(f"cannot parse duration {text!r} (use e.g. 7D, 12h, 30m, 10s)")
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if value <= 0:
        raise ConfigError(f"duration {text!r} must be positive")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not an integer") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not a number") from None


def _lag(text: str) -> float:
    """A duration that may be zero (delete the local copy as soon as it is offloaded)."""
    return 0.0 if text.strip() in ("0", "0s") else parse_duration(text)


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ConfigError(f"{text!r} is not true or false")


def _encryption(text: str) -> str:
    """``true`` / ``aes-256-gcm`` turn encryption on, ``false`` / ``none`` off."""
    value = text.strip().lower()
    if value in ("true", "aes-256-gcm"):
        return "aes-256-gcm"
    if value in ("false", "none"):
        return "none"
    raise ConfigError(f"x-tierlog-encryption must be aes-256-gcm, true, none or false: {text!r}")


_ARGUMENTS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "max-length-bytes": ("max_bytes", _int),
    "max-age": ("max_age_seconds", parse_duration),
    "stream-max-segment-size-bytes": ("max_segment_bytes", _int),
    "x-tierlog-local-max-bytes": ("local_max_bytes", _int),
    "x-tierlog-local-max-age": ("local_max_age_seconds", parse_duration),
    "x-tierlog-max-segment-chunks": ("max_segment_chunks", _int),
    "x-tierlog-tier-mode": ("tier_mode", str),
    "x-tierlog-fragment-bytes": ("fragment_bytes", _int),
    "x-tierlog-max-fragment-age": ("max_fragment_age_seconds", parse_duration),
    "x-tierlog-debounce-count": ("debounce_count", _int),
    "x-tierlog-debounce-seconds": ("debounce_seconds", _float),
    "x-tierlog-max-lag-bytes": ("max_lag_bytes", _int),
    "x-tierlog-read-strategy": ("read_strategy", str),
    "x-tierlog-manifest-fanout": ("manifest_fanout", _int),
    "x-tierlog-offload-threshold-bytes": ("offload_threshold_bytes", _int),
    "x-tierlog-offload-threshold-age": ("offload_threshold_age_seconds", parse_duration),
    "x-tierlog-offload-deletion-lag": ("offload_deletion_lag_seconds", _lag),
    "x-tierlog-offload-block-size": ("offload_block_size", _int),
    "x-tierlog-sync": ("sync", str),
    "x-tierlog-compression": ("compression", str),
    "x-tierlog-compression-level": ("compression_level", _int),
    "x-tierlog-dictionary": ("dictionary", _bool),
    "x-tierlog-encryption": ("encryption", _encryption),
    "x-tierlog-index-key": ("index_key", check_index_key),
    "x-tierlog-delayed": ("delayed", _bool),
    "x-tierlog-delayed-horizon": ("delayed_horizon_seconds", parse_duration),
    "x-tierlog-ack": ("ack", str),
    "stream-filter-size-bytes": ("filter_size", _int),
}
"""Argument name → (StreamSettings field, parser)."""

IGNORED_ARGUMENTS = frozenset({"initial-cluster-size"})
"""Arguments read elsewhere (the replication factor: ``initial_cluster_size``)."""

LEADER_LOCATORS = ("client-local",)
"""``queue-leader-locator`` values tierlog implements: the node the client created the
stream on leads it. RabbitMQ's ``balanced`` (and the older ``least-leaders``, ``random``)
are refused until placement can balance, never accepted and ignored."""


def settings_changes(arguments: Mapping[str, str]) -> dict[str, Any]:
    """StreamSettings field changes for stream arguments; ConfigError on a bad one."""
    changes: dict[str, Any] = {}
    for raw_name, raw_value in arguments.items():
        name = raw_name
        if name.startswith("x-") and not name.startswith("x-tierlog-"):
            name = name[2:]
        if name in IGNORED_ARGUMENTS:
            continue
        if name == "queue-leader-locator":
            if str(raw_value) not in LEADER_LOCATORS:
                raise ConfigError(
                    f"{raw_name} {raw_value!r} is not supported: the node the client creates"
                    f" a stream on leads it (client-local)"
                )
            continue
        spec = _ARGUMENTS.get(name)
        if spec is None:
            raise ConfigError(f"unknown stream argument {raw_name!r}")
        field_name, parse = spec
        changes[field_name] = parse(str(raw_value))
    if changes.get("encryption", "none") != "none" and process_keyring() is None:
        raise ConfigError(
            "x-tierlog-encryption needs a key-encryption key: configure [encryption] keys "
            "(or TIERLOG_KEKS / TIERLOG_KEK_FILE) on the server"
        )
    return changes


def settings_from_arguments(
    arguments: Mapping[str, str], base: StreamSettings | None = None
) -> StreamSettings:
    """StreamSettings for Create: ``base`` (defaults) updated with the arguments."""
    base = base or StreamSettings()
    changes = settings_changes(arguments)
    settings = base.updated(**changes) if changes else base
    check_new_settings(settings)
    return settings


CLUSTER_SIZE_ARGUMENTS = ("initial-cluster-size", "x-initial-cluster-size")


def initial_cluster_size(arguments: Mapping[str, str], default: int) -> int:
    """The replication factor a Create asks for (``x-initial-cluster-size``, else
    ``default``), validated from the arguments alone: a bad value is refused whether or
    not the stream exists, as RabbitMQ validates a declaration's arguments before it
    looks the stream up."""
    size = default
    for key in CLUSTER_SIZE_ARGUMENTS:
        if key in arguments:
            try:
                size = int(arguments[key])
            except ValueError:
                raise ConfigError(f"{key} must be an integer, got {arguments[key]!r}") from None
    if size < 1:
        raise ConfigError(f"initial-cluster-size must be >= 1, got {size}")
    return size
