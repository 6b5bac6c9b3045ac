"""The key-encryption keys (KEKs) a process holds, and the ciphers of stream objects.

Keys come from a key file or the environment, never from the object store. A key file holds
one key per line, ``id:base64-of-32-bytes``; blank lines and ``#`` comments are skipped. The
first key is the current one: new objects are wrapped under it. Older keys stay listed so
objects wrapped under them remain readable (rotation: add the new key on the first line,
keep the old ones until nothing references them). The environment variable ``TIERLOG_KEKS``
holds the same lines separated by commas; ``TIERLOG_KEK_FILE`` names a key file.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
from collections.abc import Mapping

from tierlog.errors import ConfigError
from tierlog.formats.encryption import (
    AesGcmFrameCipher,
    check_kek,
    new_cipher,
    open_cipher,
    open_object,
    seal_object,
)
from tierlog.formats.errors import FormatError
from tierlog.formats.fragment_v2 import CipherFor

ENV_KEYS = "TIERLOG_KEKS"
ENV_KEY_FILE = "TIERLOG_KEK_FILE"


class Keyring:
    """Named 256-bit KEKs; the first is the current one."""

    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise ConfigError("a keyring needs at least one key")
        held: dict[str, bytes] = {}
        for kek_id, kek in keys:
            try:
                check_kek(kek_id, kek)
            except FormatError as exc:
                raise ConfigError(str(exc)) from None
            if kek_id in held:
                raise ConfigError(f"key id {kek_id!r} listed twice")
            held[kek_id] = kek
        self.current_id = keys[0][0]
        self.keys: Mapping[str, bytes] = held

    @classmethod
    def parse(cls, text: str, *, source: str = "keys") -> Keyring:
        """Keys from ``id:base64`` lines (or comma-separated entries)."""
        keys: list[tuple[str, bytes]] = []
        for raw in text.replace(",", "\n").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            kek_id, sep, encoded = line.partition(":")
            if not sep:
                raise ConfigError(f"{source}: expected id:base64-key, got {line[:20]!r}...")
            try:
                kek = base64.b64decode(encoded.strip(), validate=True)
            except binascii.Error:
                raise ConfigError(f"{source}: key {kek_id.strip()!r} is not base64") from None
            keys.append((kek_id.strip(), kek))
        return cls(keys)

    @classmethod
    def from_file(cls, path: str) -> Keyring:
        try:
            with open(path, encoding="utf-8") as f:
                return cls.parse(f.read(), source=path)
        except OSError as exc:
            raise ConfigError(f"cannot read key file {path}: {exc.strerror}") from None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Keyring | None:
        """The keyring the environment configures, or None when it configures none."""
        env = os.environ if environ is None else environ
        if env.get(ENV_KEYS):
            return cls.parse(env[ENV_KEYS], source=ENV_KEYS)
        if env.get(ENV_KEY_FILE):
            return cls.from_file(env[ENV_KEY_FILE])
        return None

    @classmethod
    def from_table(cls, keys: Mapping[str, str], current: str, *, source: str) -> Keyring:
        """Keys as the server config names them: ``id = "base64:<key>"`` inline, or
        ``id = "<path>"`` of a file holding the key (base64 text or the 32 raw bytes);
        ``current`` is the id new objects are wrapped under (optional with one key)."""
        if not keys:
            raise ConfigError(f"{source}.keys is empty: name at least one key")
        if not current:
            if len(keys) > 1:
                raise ConfigError(f"{source}.current must name one of {sorted(keys)}")
            current = next(iter(keys))
        if current not in keys:
            raise ConfigError(f"{source}.current {current!r} is not one of {sorted(keys)}")
        loaded = [(current, _load_key(current, keys[current], source))]
        loaded += [(k, _load_key(k, v, source)) for k, v in keys.items() if k != current]
        return cls(loaded)

    def new_cipher(self, object_key: str) -> AesGcmFrameCipher:
        """The cipher of a new object: fresh data key wrapped under the current KEK."""
        return new_cipher(object_key, self.current_id, self.keys[self.current_id])

    def cipher_for(self, object_key: str) -> CipherFor:
        """Opens existing objects under ``object_key`` from their key block."""
        return lambda key_block: open_cipher(object_key, key_block, self.keys)

    def seal(self, object_key: str, data: bytes) -> bytes:
        """A whole non-fragment object sealed for ``object_key``."""
        return seal_object(data, self.new_cipher(object_key))

    def open(self, object_key: str, data: bytes) -> bytes:
        return open_object(data, object_key, self.keys)


def _load_key(kek_id: str, value: str, source: str) -> bytes:
    where = f"{source}.keys.{kek_id}"
    if value.startswith("base64:"):
        text = value[len("base64:") :]
    else:
        try:
            with open(value, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read key file {value}: {exc.strerror}") from None
        if len(raw) == 32:
            return raw
        text = raw.decode("ascii", errors="replace")
    try:
        key = base64.b64decode("".join(text.split()), validate=True)
    except binascii.Error:
        raise ConfigError(f"{where} is not base64 (nor a 32-byte key file)") from None
    if len(key) != 32:
        raise ConfigError(f"{where} is {len(key)} bytes, AES-256 needs 32")
    return key


def install_configured_keyring(keyring: Keyring | None) -> Keyring | None:
    """Make the server config's keyring the process's, unless the environment configures
    keys (``TIERLOG_KEKS`` / ``TIERLOG_KEK_FILE`` override the config file). Returns the
    keyring in force."""
    from_env = Keyring.from_environment()
    if from_env is not None:
        set_process_keyring(from_env)
        return from_env
    if keyring is not None:
        set_process_keyring(keyring)
    return process_keyring()


_process_lock = threading.Lock()
_process_keyring: Keyring | None = None
_process_loaded = False


def process_keyring() -> Keyring | None:
    """The keyring this process's environment configures (read once), or None."""
    global _process_keyring, _process_loaded
    with _process_lock:
        if not _process_loaded:
            _process_keyring = Keyring.from_environment()
            _process_loaded = True
        return _process_keyring


def set_process_keyring(keyring: Keyring | None) -> None:
    """Replace the process keyring (a server configured from a file; tests)."""
    global _process_keyring, _process_loaded
    with _process_lock:
        _process_keyring = keyring
        _process_loaded = True


def reset_process_keyring() -> None:
    """Forget the process keyring; the next use reads the environment again."""
    global _process_keyring, _process_loaded
    with _process_lock:
        _process_keyring = None
        _process_loaded = False


def opener_for(object_key: str, keyring: Keyring | None = None) -> CipherFor | None:
    """How to open the frames of ``object_key`` with ``keyring`` (default: the process's)."""
    ring = keyring if keyring is not None else process_keyring()
    return ring.cipher_for(object_key) if ring is not None else None
