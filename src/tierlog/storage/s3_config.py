"""Typed, validated configuration of the S3 backend (from code, a URI or the environment).

Validation happens here, before any network call, so a typo in a bucket name or endpoint is a
``ConfigError`` naming the bad value rather than an obscure client failure later.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tierlog.errors import ConfigError
from tierlog.storage.credentials import CREDENTIALS_FILE_ENV, load_credentials_file

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_REGION = re.compile(r"^[a-z0-9-]{1,64}$")


@dataclass(frozen=True)
class S3Config:
    """Where the bucket is and how to talk to it."""

    bucket: str
    prefix: str = ""  # every key is stored as ``{prefix}/{key}``
    endpoint: str | None = None  # None = AWS; e.g. http://127.0.0.1:8333 for SeaweedFS
    region: str = "us-east-1"
    access_key_id: str | None = None  # None (with no secret) = the client's credential chain
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    virtual_hosted_style: bool = False  # path style works everywhere incl. SeaweedFS / MinIO
    max_concurrency: int = 32  # requests in flight per store
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 60.0
    max_attempts: int = 6  # retries of idempotent requests, including the first try

    def __post_init__(self) -> None:
        if not _BUCKET.match(self.bucket) or ".." in self.bucket:
            raise ConfigError(f"invalid S3 bucket name {self.bucket!r}")
        if self.prefix:
            segments = self.prefix.split("/")
            if any(s in ("", ".", "..") for s in segments) or "\\" in self.prefix:
                raise ConfigError(
                    f"invalid S3 key prefix {self.prefix!r}: no leading, trailing or double "
                    "slashes, no '.' or '..' segments"
                )
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"invalid S3 endpoint {self.endpoint!r}: need http(s)://host")
            try:
                parts.port  # noqa: B018 - raises ValueError on a bad port
            except ValueError:
                raise ConfigError(f"invalid port in S3 endpoint {self.endpoint!r}") from None
            if parts.path not in ("", "/") or parts.query:
                raise ConfigError(f"S3 endpoint {self.endpoint!r} must not have a path or query")
        if not _REGION.match(self.region):
            raise ConfigError(f"invalid S3 region {self.region!r}")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ConfigError("S3 credentials need both an access key id and a secret key")
        if self.max_concurrency < 1 or self.max_attempts < 1:
            raise ConfigError("S3 max_concurrency and max_attempts must be >= 1")
        if self.connect_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise ConfigError("S3 timeouts must be positive")

    @property
    def allow_http(self) -> bool:
        return self.endpoint is not None and self.endpoint.startswith("http://")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> S3Config:
        """From ``TIERLOG_S3_BUCKET``, ``TIERLOG_S3_PREFIX``, ``TIERLOG_S3_ENDPOINT`` (or
        ``AWS_ENDPOINT_URL``), ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``),
        ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``;
        ``overrides`` win over the environment."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {
            "bucket": env.get("TIERLOG_S3_BUCKET"),
            "prefix": env.get("TIERLOG_S3_PREFIX"),
            "endpoint": env.get("TIERLOG_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL"),
            "region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
            "access_key_id": env.get("AWS_ACCESS_KEY_ID"),
            "secret_access_key": env.get("AWS_SECRET_ACCESS_KEY"),
            "session_token": env.get("AWS_SESSION_TOKEN"),
        }
        values.update(overrides)
        values = {k: v for k, v in values.items() if v is not None}
        if "bucket" not in values:
            raise ConfigError("no S3 bucket configured (set TIERLOG_S3_BUCKET)")
        return cls._build(values)

    @classmethod
    def from_uri(cls, uri: str, env: Mapping[str, str] | None = None, **overrides: Any) -> S3Config:
        """``s3://bucket/prefix?endpoint=http://127.0.0.1:8333&region=us-east-1``; other
        settings (credentials, timeouts, concurrency) from ``overrides`` or the environment.
        Credentials: ``credentials_file=PATH`` in the URI or ``TIERLOG_S3_CREDENTIALS_FILE``
        (a TOML file only its owner may read), else ``AWS_*`` variables, else the chain."""
        parts = urlsplit(uri)
        if parts.scheme != "s3" or not parts.netloc:
            raise ConfigError(f"invalid S3 URI {uri!r}: need s3://bucket[/prefix]")
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        unknown = set(query) - {"endpoint", "region", "credentials_file"}
        if unknown:
            raise ConfigError(f"unknown S3 URI parameters {sorted(unknown)} in {uri!r}")
        values: dict[str, Any] = {"bucket": parts.netloc, "prefix": parts.path.strip("/")}
        env = os.environ if env is None else env
        credentials_file = query.pop("credentials_file", "") or env.get(CREDENTIALS_FILE_ENV)
        if credentials_file:
            values.update(load_credentials_file(credentials_file))
        values.update(query)
        values.update(overrides)
        for name, var in (
            ("access_key_id", "AWS_ACCESS_KEY_ID"),
            ("secret_access_key", "AWS_SECRET_ACCESS_KEY"),
            ("session_token", "AWS_SESSION_TOKEN"),
        ):
            if name not in values and env.get(var):
                values[name] = env[var]
        return cls._build(values)

    @classmethod
    def _build(cls, values: dict[str, Any]) -> S3Config:
        known = {f.name: f.type for f in fields(cls)}
        unknown = set(values) - set(known)
        if unknown:
            raise ConfigError(f"unknown S3 settings {sorted(unknown)}")
        for name in ("max_concurrency", "max_attempts"):
            if name in values:
                values[name] = _number(name, values[name], int)
        for name in ("connect_timeout_s", "request_timeout_s"):
            if name in values:
                values[name] = _number(name, values[name], float)
        if isinstance(values.get("virtual_hosted_style"), str):
            values["virtual_hosted_style"] = values["virtual_hosted_style"].lower() in (
                "1",
                "true",
                "yes",
            )
        return cls(**values)


def _number(name: str, value: Any, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"S3 setting {name} must be a number, got {value!r}") from None
