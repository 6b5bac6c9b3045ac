"""The process keyring for a test that seals or opens encrypted objects."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tierlog.remote.encryption import Keyring, reset_process_keyring, set_process_keyring

TEST_KEK = ("k1", bytes(range(32)))


@contextlib.contextmanager
def process_keyring(*keys: tuple[str, bytes]) -> Iterator[Keyring]:
    """Install a keyring of ``keys`` (default ``TEST_KEK``) as the process keyring for
    the block, and reset it afterwards whatever happens."""
    ring = Keyring(list(keys or (TEST_KEK,)))
    set_process_keyring(ring)
    try:
        yield ring
    finally:
        reset_process_keyring()
