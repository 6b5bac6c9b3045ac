"""How the tierer stores a stream's fragments when its settings ask for compression or
encryption: fragment format v2, and the stream's zstd dictionary.

The dictionary is trained from the chunks of the first fragment that needs it (pieces of the
chunks' bytes as samples), stored once as an immutable uid-named object (sealed when the
stream is encrypted) before any fragment naming it is uploaded, and used until the stored
size of a fragment grows past ``RETRAIN_FACTOR`` times what the dictionary achieved on its
first fragment: then the next fragment trains a new one. A tierer that restarts trains a new
dictionary; fragments keep naming the one they were written with, which is never rewritten.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from tierlog.formats.fragment import FragmentChunkInfo, FragmentPlacement
from tierlog.formats.fragment_v2 import (
    CODECS,
    FrameCoding,
    encode_fragment_v2,
)
from tierlog.formats.zstd_dictionary import MIN_TRAINING_SAMPLES, train_dictionary
from tierlog.logs import get_logger
from tierlog.remote import keys
from tierlog.remote.dictionaries import dictionary_key, put_dictionary
from tierlog.remote.encryption import Keyring, process_keyring
from tierlog.remote.fragments import RemoteStream
from tierlog.remote.settings import StreamSettings
from tierlog.tiering.errors import EncryptionKeyMissingError

log = get_logger(__name__)

DICTIONARY_BYTES = 32 << 10
SAMPLE_BYTES = 2 << 20
SAMPLE_PIECE = 1 << 10
MIN_DICTIONARY_BYTES = 1 << 10
RETRAIN_FACTOR = 1.25


class _Dictionary:
    __slots__ = ("baseline", "data", "id")

    def __init__(self, dictionary_id: bytes, data: bytes) -> None:
        self.id = dictionary_id
        self.data = data
        self.baseline: float | None = None  # stored / chunk bytes of its first fragment


class FragmentCoder:
    """Encodes fragments as the stream's current settings ask; thread-safe (uploads run on
    a pool)."""

    def __init__(
        self,
        remote: RemoteStream,
        settings: Callable[[], StreamSettings],
        keyring: Callable[[], Keyring | None] = process_keyring,
    ) -> None:
        self.remote = remote
        self._settings = settings
        self._keyring = keyring
        self._lock = threading.Lock()
        self._dictionary: _Dictionary | None = None
        self.dictionaries_trained = 0
        self.stored_bytes = 0
        self.chunk_bytes = 0

    def wants_v2(self) -> bool:
        return self._settings().cold_coding

    def settings(self) -> StreamSettings:
        """The stream's settings now (one snapshot per fragment: see ``encode``)."""
        return self._settings()

    def encode(
        self,
        key: str,
        placement: FragmentPlacement,
        chunks: Sequence[memoryview],
        infos: Sequence[FragmentChunkInfo],
        settings: StreamSettings | None = None,
    ) -> bytearray:
        """The whole v2 fragment object for ``key``, coded as ``settings`` (the stream's
        current ones when None) ask: the caller that must know whether it is sealed
        passes the snapshot it decides from."""
        settings = settings if settings is not None else self._settings()
        cipher = None
        keyring = None
        if settings.encryption != "none":
            keyring = self._keyring()
            if keyring is None:
                log.error("encryption_key_missing", stream=self.remote.stream_dir)
                raise EncryptionKeyMissingError(
                    f"stream {self.remote.stream_dir} is encrypted and no key-encryption key "
                    "is configured (TIERLOG_KEKS / TIERLOG_KEK_FILE)"
                )
            cipher = keyring.new_cipher(key)
        codec = CODECS[settings.compression]
        dictionary = self._current_dictionary(chunks, keyring) if settings.dictionary else None
        coding = FrameCoding(
            codec=codec,
            level=settings.compression_level,
            dictionary_id=dictionary.id if dictionary else bytes(16),
            dictionary=dictionary.data if dictionary else None,
            cipher=cipher,
        )
        parts, trailer = encode_fragment_v2(placement, chunks, infos, coding)
        body = bytearray().join(parts)
        stored = trailer.index_start - 8
        with self._lock:
            self.stored_bytes += stored
            self.chunk_bytes += trailer.data_size
            if dictionary is not None:
                ratio = stored / max(1, trailer.data_size)
                if dictionary.baseline is None:
                    dictionary.baseline = ratio
                elif (
                    ratio > dictionary.baseline * RETRAIN_FACTOR and self._dictionary is dictionary
                ):
                    log.info(
                        "dictionary_retrain",
                        stream=self.remote.stream_dir,
                        ratio=round(ratio, 4),
                        baseline=round(dictionary.baseline, 4),
                    )
                    self._dictionary = None
        return body

    def _current_dictionary(
        self, chunks: Sequence[memoryview], keyring: Keyring | None
    ) -> _Dictionary | None:
        with self._lock:
            if self._dictionary is not None:
                return self._dictionary
            samples = _samples(chunks)
            if len(samples) < MIN_TRAINING_SAMPLES:
                return None  # too little data yet: this fragment goes without
            size = sum(len(x) for x in samples) // 10  # zstd wants ~10x the dictionary
            size = min(DICTIONARY_BYTES, max(MIN_DICTIONARY_BYTES, size))
            try:
                data = train_dictionary(samples, size)
            except ValueError as exc:  # FormatError: data zstd cannot train on
                log.warning(
                    "dictionary_training_failed", stream=self.remote.stream_dir, error=str(exc)
                )
                return None
            dictionary = _Dictionary(keys.new_uid(), data)
            key = dictionary_key(self.remote.prefix, self.remote.stream_dir, dictionary.id)
            put_dictionary(self.remote.store, key, dictionary.id, data, keyring)
            self._dictionary = dictionary
            self.dictionaries_trained += 1
            log.info(
                "dictionary_trained",
                stream=self.remote.stream_dir,
                dictionary=dictionary.id.hex(),
                size=len(data),
                samples=len(samples),
            )
            return dictionary


def _samples(chunks: Sequence[memoryview]) -> list[bytes]:
    """Pieces of the chunks' bytes, up to ``SAMPLE_BYTES``, spread over the fragment."""
    total = sum(c.nbytes for c in chunks)
    stride = max(1, total // SAMPLE_BYTES)
    out: list[bytes] = []
    taken = 0
    for i, chunk in enumerate(chunks):
        if i % stride:
            continue
        for at in range(0, chunk.nbytes, SAMPLE_PIECE):
            out.append(bytes(chunk[at : at + SAMPLE_PIECE]))
            taken += min(SAMPLE_PIECE, chunk.nbytes - at)
        if taken >= SAMPLE_BYTES:
            break
    return out
