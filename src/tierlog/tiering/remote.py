"""One stream's objects in the remote tier: fragment metadata reads and the adoption rule."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tierlog.errors import TierlogError
from tierlog.formats.errors import FormatError
from tierlog.formats.fragment import (
    TRAILER_SIZE,
    FragmentIndex,
    FragmentTrailer,
    decode_index,
    decode_trailer,
    index_range,
)
from tierlog.storage.errors import NotFoundError
from tierlog.storage.object_store import ObjectStore
from tierlog.tiering import keys
from tierlog.tiering.state import FragmentEntry


class TieringError(TierlogError):
    """Base class of errors that stop tiering a stream."""


class FragmentConflictError(TieringError):
    """A remote fragment exists that this writer must not adopt."""


class DeposedError(TieringError):
    """A writer with a newer epoch owns the stream: stop tiering it."""


class StreamDeletedError(TieringError):
    """The stream incarnation was deleted while we were tiering it."""


@dataclass(frozen=True, slots=True)
class LocalChunk:
    """What the adoption rule compares with a remote fragment's index record."""

    epoch: int
    crc: int
    size: int


@dataclass(frozen=True, slots=True)
class RemoteFragment:
    trailer: FragmentTrailer
    index: FragmentIndex

    def entry(self) -> FragmentEntry:
        t = self.trailer
        return FragmentEntry(
            first_offset=t.first_offset,
            next_offset=t.next_offset,
            min_timestamp=t.min_timestamp,
            max_timestamp=t.max_timestamp,
            data_size=t.data_size,
            chunk_count=t.chunk_count,
            max_epoch=t.max_epoch,
        )


class RemoteStream:
    """Key naming and metadata reads for one stream incarnation."""

    def __init__(self, store: ObjectStore, prefix: str, stream_dir: str) -> None:
        self.store = store
        self.prefix = prefix
        self.stream_dir = stream_dir

    def fragment_key(self, first_offset: int) -> str:
        return keys.fragment_key(self.prefix, self.stream_dir, first_offset)

    def root_key(self, uid: bytes) -> str:
        return keys.root_key(self.prefix, self.stream_dir, uid)

    def load(self, key: str) -> bytes:
        return self.store.get(key)

    def read_fragment(self, first_offset: int) -> RemoteFragment | None:
        """Trailer (one suffix GET) and index (one ranged GET); None if absent.

        Raises FormatError when the object is not a valid fragment (bad CRC, truncated).
        """
        key = self.fragment_key(first_offset)
        try:
            tail = self.store.get_suffix(key, TRAILER_SIZE)
        except NotFoundError:
            return None
        trailer = decode_trailer(tail)
        start, end = index_range(trailer.data_size, trailer.chunk_count)
        index = decode_index(self.store.get(key, start, end), trailer)
        if trailer.first_offset != first_offset:
            raise FragmentConflictError(f"{key}: trailer says first offset {trailer.first_offset}")
        return RemoteFragment(trailer, index)


def adoption_problem(
    fragment: RemoteFragment, epoch: int, local: Mapping[int, LocalChunk]
) -> str | None:
    """Why the writer must not adopt ``fragment``, or None when it may (DESIGN.md):
    its CRC is valid (checked while decoding), its max epoch is not newer than the
    writer's, and for chunks still held locally its index matches them."""
    t = fragment.trailer
    if t.max_epoch > epoch:
        return f"fragment {t.first_offset} has epoch {t.max_epoch} > writer epoch {epoch}"
    records = fragment.index.records
    for i in range(len(records)):
        chunk_id = int(records["chunk_id"][i])
        mine = local.get(chunk_id)
        if mine is None:
            continue
        if (
            int(records["epoch"][i]) != mine.epoch
            or int(records["crc"][i]) != mine.crc
            or int(records["size"][i]) != mine.size
        ):
            return f"fragment {t.first_offset}: chunk {chunk_id} differs from the local log"
    return None


def read_fragment_checked(remote: RemoteStream, first_offset: int) -> RemoteFragment | None:
    """``read_fragment`` with format errors turned into a conflict."""
    try:
        return remote.read_fragment(first_offset)
    except FormatError as exc:
        raise FragmentConflictError(f"fragment {first_offset} is corrupt: {exc}") from exc
