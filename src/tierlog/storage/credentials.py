"""S3 credentials from a file the operator has locked down.

A credentials file is TOML with ``access_key_id``, ``secret_access_key`` and optional
``session_token``. It is refused when group or others may read it (as ssh refuses a
private key): a secret readable by every local account is not a secret. Error
messages name the file and the problem, never its contents.
"""

from __future__ import annotations

import os
import stat
import tomllib
from typing import Any

from tierlog.errors import ConfigError

CREDENTIAL_KEYS = ("access_key_id", "secret_access_key", "session_token")
CREDENTIALS_FILE_ENV = "TIERLOG_S3_CREDENTIALS_FILE"


def load_credentials_file(path: str) -> dict[str, Any]:
    """The credential fields of ``path``; ConfigError when unreadable, open to others or odd."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ConfigError(f"cannot open S3 credentials file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"S3 credentials file {path} is not a regular file")
        if info.st_mode & 0o077:
            raise ConfigError(
                f"S3 credentials file {path} is accessible by group or others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); chmod 600 it"
            )
        with os.fdopen(fd, "rb") as f:
            fd = -1
            try:
                data = tomllib.load(f)
            except tomllib.TOMLDecodeError:
                # the decoder's message may quote the secret: say only where
                raise ConfigError(f"S3 credentials file {path} is not valid TOML") from None
    finally:
        if fd >= 0:
            os.close(fd)
    unknown = set(data) - set(CREDENTIAL_KEYS)
    if unknown:
        raise ConfigError(f"unknown keys {sorted(unknown)} in S3 credentials file {path}")
    if not all(isinstance(v, str) and v for v in data.values()):
        raise ConfigError(f"S3 credentials file {path}: values must be non-empty strings")
    if "access_key_id" not in data or "secret_access_key" not in data:
        raise ConfigError(f"S3 credentials file {path} needs access_key_id and secret_access_key")
    return dict(data)
