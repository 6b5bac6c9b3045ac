"""Per-stream cold-data settings: arguments map onto StreamSettings, bad values are refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.keyring import process_keyring
from tierlog.errors import ConfigError
from tierlog.remote.encryption import Keyring, set_process_keyring
from tierlog.remote.settings import StreamSettings
from tierlog.server.arguments import settings_from_arguments


@pytest.fixture(autouse=True)
def keyring() -> Iterator[Keyring]:
    with process_keyring(("k1", bytes(32))) as ring:
        yield ring


def test_arguments_map_to_settings() -> None:
    s = settings_from_arguments(
        {
            "x-tierlog-compression": "zstd",
            "x-tierlog-compression-level": "9",
            "x-tierlog-dictionary": "true",
            "x-tierlog-encryption": "aes-256-gcm",
        }
    )
    assert (s.compression, s.compression_level, s.dictionary, s.encryption) == (
        "zstd",
        9,
        True,
        "aes-256-gcm",
    )
    assert s.cold_coding
    assert settings_from_arguments({"x-tierlog-encryption": "true"}).encryption == "aes-256-gcm"
    assert not StreamSettings().cold_coding  # the default stays fragment format v1
    assert StreamSettings.from_dict(s.to_dict()) == s


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-tierlog-compression": "lzma"},
        {"x-tierlog-compression": "zstd", "x-tierlog-compression-level": "0"},
        {"x-tierlog-compression": "zstd", "x-tierlog-compression-level": "23"},
        {"x-tierlog-compression-level": "x"},
        {"x-tierlog-dictionary": "true"},  # needs zstd
        {"x-tierlog-compression": "zstd", "x-tierlog-dictionary": "maybe"},
        {"x-tierlog-encryption": "rot13"},
    ],
)
def test_bad_values_are_refused(arguments: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        settings_from_arguments(arguments)


def test_encryption_needs_a_key() -> None:
    set_process_keyring(None)
    with pytest.raises(ConfigError, match="key-encryption key"):
        settings_from_arguments({"x-tierlog-encryption": "true"})
    assert settings_from_arguments({"x-tierlog-encryption": "none"}).encryption == "none"
