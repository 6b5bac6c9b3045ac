"""The one append path of a stream log: the gate, deduplication by publishing id,
splitting into chunks, and checking entries, for every way records come in.

Records arrive as entries (``append``: bytes or sub-batches, encoded here), plain
records (``append_records``), one pre-encoded chunk data section (``append_encoded``)
or a run of pre-encoded batches such as Publish frames (``append_batches``: the
server's path, written without re-encoding). All of them pass ``admit`` (open log,
back-pressure gate) before anything is written, drop duplicates with ``kept_indexes``
and cut chunks with ``chunk_ranges``; chunks are written by the log (``ChunkSink``).
"""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from tierlog.formats.bloom import UNFILTERED, bloom_bytes
from tierlog.formats.chunk import (
    MAX_ENTRIES_PER_CHUNK,
    SUB_BATCH_HEADER_SIZE,
    Entry,
    SubBatch,
    count_entry_data,
    encode_entries,
    encode_records,
    encode_uniform_records,
)
from tierlog.formats.errors import FormatError, RecordSizeError
from tierlog.formats.tracking import MAX_ID_BYTES
from tierlog.log.config import LogConfig
from tierlog.log.errors import InvalidAppendError, RecordTooLargeError

MAX_U64 = 2**64 - 1
_U32 = struct.Struct(">I")


class AppendResult(NamedTuple):
    """What one append did.

    ``first_offset`` / ``last_offset`` are the offsets given to the first and last
    written record (None when everything was a duplicate); ``chunk_ids`` the chunks
    written. ``written`` / ``dropped`` are the publishing ids kept and dropped as
    duplicates (empty without a producer). Dropped ids are confirmed once the
    producer's last recorded chunk, ``dedup_chunk_id``, is committed.
    """

    first_offset: int | None
    last_offset: int | None
    chunk_ids: tuple[int, ...]
    written: tuple[int, ...]
    dropped: tuple[int, ...]
    dedup_chunk_id: int | None


class EncodedBatch(Protocol):
    """Entries already in Osiris encoding, each with a publishing id (a Publish frame).

    ``entries[i]`` is one entry, header included; ``record_counts`` is None when all
    entries are simple (one record each); ``entry_data()`` is all entries back to back.
    """

    @property
    def entries(self) -> Sequence[bytes | memoryview]: ...

    @property
    def publishing_ids(self) -> Sequence[int]: ...

    @property
    def record_counts(self) -> Sequence[int] | None: ...

    @property
    def num_entries(self) -> int: ...

    @property
    def num_records(self) -> int: ...

    @property
    def filter_values(self) -> Sequence[str | None] | None:
        """Each entry's filter value (Publish v2; None: a v1 frame, no values)."""
        ...

    def entry_data(self) -> bytes: ...


@dataclass
class BatchProgress:
    """How far ``append_batches`` got (kept up to date while it runs, so a caller that
    gets an exception knows which batches are already written and must not be retried)."""

    chunks: int = 0
    duplicates: int = 0
    batches: int = 0


class ChunkSink(Protocol):
    """What the append path needs from the log that writes the chunks."""

    @property
    def next_offset(self) -> int: ...

    def check_open(self) -> None: ...

    def producer_last(self, producer_id: bytes) -> int:
        """The producer's last written publishing id, -1 when unknown."""
        ...

    def producer_chunk(self, producer_id: bytes) -> int | None:
        """The chunk that recorded the producer's last publishing id, if any."""
        ...

    def write_user_chunk(
        self,
        data: bytes | memoryview,
        num_entries: int,
        num_records: int,
        producer_id: bytes | None,
        sequence: int,
        bloom: bytes = b"",
    ) -> int:
        """Write one user chunk (with the producer's sequence in its trailer when
        ``producer_id`` is set, and ``bloom`` as its bloom filter) and return its chunk id."""
        ...

    def after_write(self) -> None: ...


AppendGate = Callable[[], None]


class Appender:
    """Every append of one log goes through here (writer thread only)."""

    def __init__(self, sink: ChunkSink, config: LogConfig) -> None:
        self._sink = sink
        self._config = config
        self.gate: AppendGate | None = None
        self.duplicates_dropped = 0

    def admit(self) -> None:
        """The one gate every append passes before anything is written: the log must be
        open and the installed append gate (back-pressure) must let it through."""
        self._sink.check_open()
        gate = self.gate
        if gate is not None:
            gate()  # may raise BackPressureError: nothing is written

    # ----------------------------------------------------------------- entries

    def append(
        self,
        entries: Sequence[Entry],
        producer: str | bytes | None,
        publishing_ids: Sequence[int] | None,
    ) -> AppendResult:
        self.admit()
        return self._append_entries(list(entries), producer, publishing_ids)

    def append_records(self, records: Sequence[bytes]) -> int:
        self.admit()
        n = len(records)
        if not n:
            raise InvalidAppendError("empty batch")
        longest = max(map(len, records))
        total = sum(map(len, records)) + 4 * n
        config = self._config
        if (
            longest > config.max_record_bytes
            or total > config.max_chunk_bytes
            or n > MAX_ENTRIES_PER_CHUNK
        ):
            result = self._append_entries(list(records), None, None)
            assert result.first_offset is not None
            return result.first_offset
        chunk_id = self._sink.write_user_chunk(encode_records(records), n, n, None, 0)
        self._sink.after_write()
        return chunk_id

    def _append_entries(
        self,
        entries: list[Entry],
        producer: str | bytes | None,
        publishing_ids: Sequence[int] | None,
    ) -> AppendResult:
        sink = self._sink
        if producer is None and publishing_ids is None:
            encoded = self._encode_plain(entries)
            if encoded is not None:  # the common case: plain records, one chunk
                n = len(entries)
                chunk_id = sink.write_user_chunk(encoded, n, n, None, 0)
                sink.after_write()
                return AppendResult(chunk_id, chunk_id + n - 1, (chunk_id,), (), (), None)
        plain = self._check_sizes(entries)
        dropped: tuple[int, ...] = ()
        producer_id: bytes | None = None
        ids: Sequence[int] = ()
        if producer is not None:
            producer_id = tracking_id(producer, "producer name")
            if publishing_ids is None or len(publishing_ids) != len(entries):
                raise InvalidAppendError("publishing_ids must give one id per entry")
            check_publishing_ids(publishing_ids)
            kept = kept_indexes(publishing_ids, sink.producer_last(producer_id))
            if kept is None:
                ids = publishing_ids
            else:
                dropped = tuple(_others(publishing_ids, kept))
                ids = [publishing_ids[i] for i in kept]
                entries = [entries[i] for i in kept]
            self.duplicates_dropped += len(dropped)
        elif publishing_ids is not None:
            raise InvalidAppendError("publishing_ids need a producer")
        ranges = chunk_ranges(_entry_sizes(entries, plain), self._config.max_chunk_bytes)
        chunk_ids: list[int] = []
        for lo, hi in ranges:
            group = entries[lo:hi]
            if plain:
                data, num_entries, num_records = encode_records(group), len(group), len(group)  # type: ignore[arg-type]
            else:
                data, num_entries, num_records = encode_entries(group)
            sequence = ids[hi - 1] if producer_id is not None else 0
            chunk_ids.append(
                sink.write_user_chunk(data, num_entries, num_records, producer_id, sequence)
            )
        sink.after_write()
        return AppendResult(
            chunk_ids[0] if chunk_ids else None,
            sink.next_offset - 1 if chunk_ids else None,
            tuple(chunk_ids),
            tuple(ids),
            dropped,
            None if producer_id is None else sink.producer_chunk(producer_id),
        )

    def _encode_plain(self, entries: list[Entry]) -> bytes | None:
        """The chunk data of plain records fitting one chunk, or None (the general path
        then splits, checks types and raises the right errors)."""
        try:
            lengths = list(map(len, entries))  # type: ignore[arg-type]
        except TypeError:  # a SubBatch (or something else without a length)
            return None
        n = len(lengths)
        if not n or n > MAX_ENTRIES_PER_CHUNK:
            return None
        uniform = lengths.count(lengths[0]) == n
        longest = lengths[0] if uniform else max(lengths)
        total = n * lengths[0] if uniform else sum(lengths)
        if longest > self._config.max_record_bytes or total + 4 * n > self._config.max_chunk_bytes:
            return None
        try:
            if uniform:
                return encode_uniform_records(entries, lengths[0])  # type: ignore[arg-type]
            prefixes = map(_U32.pack, lengths)
            return b"".join(itertools.chain.from_iterable(zip(prefixes, entries, strict=True)))  # type: ignore[arg-type]
        except TypeError:  # not bytes-like
            return None

    def _check_sizes(self, entries: list[Entry]) -> bool:
        """Check entry types and sizes; True when all entries are plain ``bytes``."""
        if not entries:
            raise InvalidAppendError("empty batch")
        limit = self._config.max_record_bytes
        if set(map(type, entries)) == {bytes}:
            longest = max(map(len, entries))  # type: ignore[arg-type]
            if longest > limit:
                raise RecordTooLargeError(f"record of {longest} bytes exceeds {limit}")
            return True
        sub_limit = self._config.max_chunk_bytes - SUB_BATCH_HEADER_SIZE
        for entry in entries:
            if isinstance(entry, SubBatch):
                if len(entry.data) > sub_limit:
                    raise RecordTooLargeError(
                        f"sub-batch of {len(entry.data)} bytes exceeds {sub_limit}"
                    )
            elif isinstance(entry, bytes | bytearray | memoryview):
                if len(entry) > limit:
                    raise RecordTooLargeError(f"record of {len(entry)} bytes exceeds {limit}")
            else:
                raise InvalidAppendError(f"entries must be bytes or SubBatch, not {type(entry)}")
        return False

    # ----------------------------------------------------------------- pre-encoded

    def append_encoded(
        self,
        data: bytes | memoryview,
        num_entries: int,
        num_records: int,
        producer: str | bytes | None,
        first_publishing_id: int | None,
        last_publishing_id: int | None,
    ) -> AppendResult:
        self._sink.check_open()
        producer_id: bytes | None = None
        if producer is not None:
            producer_id = tracking_id(producer, "producer name")
            if last_publishing_id is None:
                raise InvalidAppendError("a producer's batch needs last_publishing_id")
            first = last_publishing_id if first_publishing_id is None else first_publishing_id
            check_publishing_ids((first, last_publishing_id))
            if first > last_publishing_id:
                raise InvalidAppendError("first_publishing_id is above last_publishing_id")
            known = self._sink.producer_last(producer_id)
            if first <= known:
                raise InvalidAppendError(
                    f"publishing id {first} is not above the producer's sequence {known}"
                )
        elif first_publishing_id is not None or last_publishing_id is not None:
            raise InvalidAppendError("publishing ids need a producer")
        self.check_entry_data(data, num_entries, num_records)
        self.admit()
        chunk_id = self._sink.write_user_chunk(
            data, num_entries, num_records, producer_id, last_publishing_id or 0
        )
        self._sink.after_write()
        return AppendResult(
            chunk_id,
            chunk_id + num_records - 1,
            (chunk_id,),
            (),
            (),
            chunk_id if producer_id is not None else None,
        )

    def check_entry_data(
        self, data: bytes | memoryview, num_entries: int, num_records: int
    ) -> None:
        """Pre-encoded entries must exactly fill ``data``, number ``num_entries`` (one chunk's
        worth), hold ``num_records`` records and respect the size limits."""
        if not 1 <= num_entries <= MAX_ENTRIES_PER_CHUNK or num_records < 1:
            raise InvalidAppendError(
                f"{num_entries} entries / {num_records} records do not make a chunk"
            )
        limit = self._config.max_chunk_bytes
        if len(data) > limit:
            raise InvalidAppendError(f"{len(data)} bytes of entries exceed one chunk ({limit})")
        records = self._count_records(data, num_entries)
        if records != num_records:
            raise InvalidAppendError(f"entries hold {records} records, not {num_records}")

    def _count_records(self, data: bytes | memoryview, num_entries: int) -> int:
        config = self._config
        try:
            return count_entry_data(
                data,
                num_entries,
                config.max_record_bytes,
                config.max_chunk_bytes - SUB_BATCH_HEADER_SIZE,
            )
        except RecordSizeError as exc:
            raise RecordTooLargeError(str(exc)) from exc
        except FormatError as exc:
            raise InvalidAppendError(f"entry data: {exc}") from exc

    def append_batches(
        self, batches: Sequence[EncodedBatch], producer: str | None, progress: BatchProgress
    ) -> None:
        """Append a run of pre-encoded batches (one producer's Publish frames, or frames
        without a producer) as few chunks as fit ``max_chunk_bytes``.

        With ``producer``, publishing ids not above the producer's sequence (or an earlier
        id of the run) are dropped first; a batch that is all new, the usual case, is
        checked in C and passed on as it is. A batch over one chunk is split between its
        entries, after checking all of them, so it is never written in part.
        ``progress`` counts the batches written so far, also when this raises.
        """
        self.admit()
        producer_id = None if producer is None else tracking_id(producer, "producer name")
        last = -1 if producer_id is None else self._sink.producer_last(producer_id)
        limit = self._config.max_chunk_bytes
        pieces: list[_Piece] = []
        for batch in batches:
            if not batch.num_entries:
                pieces.append(_Piece(b"", 0, 0, last, 1))
                continue
            data = batch.entry_data()
            counts = batch.record_counts
            ids = batch.publishing_ids
            values = batch.filter_values
            keep: Sequence[int] | None = None
            if producer_id is not None:
                keep = kept_indexes(ids, last)
                if keep is not None:
                    progress.duplicates += batch.num_entries - len(keep)
                    self.duplicates_dropped += batch.num_entries - len(keep)
                    if not keep:
                        pieces.append(_Piece(b"", 0, 0, last, 1))  # confirmed as is
                        continue
                    data = b"".join([batch.entries[i] for i in keep])
                    ids = [ids[i] for i in keep]
                    if values is not None:
                        values = [values[i] for i in keep]
                last = ids[-1]
            if len(data) <= limit:
                if keep is None:
                    n_entries, n_records = batch.num_entries, batch.num_records
                else:
                    n_entries = len(keep)
                    n_records = n_entries if counts is None else sum(counts[i] for i in keep)
                pieces.append(_Piece(data, n_entries, n_records, ids[-1], 1, _filters(values)))
                continue
            # Over one chunk: alone in its chunks, split between entries (checked first).
            self._write_pieces(pieces, producer_id, progress)
            pieces = []
            entries = batch.entries if keep is None else [batch.entries[i] for i in keep]
            if counts is not None and keep is not None:
                counts = [counts[i] for i in keep]
            self._count_records(data, len(entries))
            split: list[_Piece] = []
            for lo, hi in chunk_ranges(list(map(len, entries)), limit):
                records = hi - lo if counts is None else sum(counts[lo:hi])
                part = b"".join(entries[lo:hi])
                filters = None if values is None else _filters(values[lo:hi])
                split.append(_Piece(part, hi - lo, records, ids[hi - 1], 0, filters))
            split[-1] = split[-1]._replace(batches=1)
            self._write_pieces(split, producer_id, progress, separate=True)
        self._write_pieces(pieces, producer_id, progress)

    def _write_pieces(
        self,
        pieces: list[_Piece],
        producer_id: bytes | None,
        progress: BatchProgress,
        *,
        separate: bool = False,
    ) -> None:
        """Write pieces as chunks (consecutive pieces share one when ``separate`` is off)."""
        if not pieces:
            return
        if separate:
            ranges = [(i, i + 1) for i in range(len(pieces))]
        else:
            ranges = chunk_ranges(
                [len(p.data) for p in pieces],
                self._config.max_chunk_bytes,
                [p.num_entries for p in pieces],
            )
        sink = self._sink
        for lo, hi in ranges:
            group = pieces[lo:hi]
            entries = sum(p.num_entries for p in group)
            if entries:
                data = group[0].data if len(group) == 1 else b"".join([p.data for p in group])
                records = sum(p.num_records for p in group)
                if not separate:  # entries from the network: checked before written
                    self.check_entry_data(data, entries, records)
                last_id = group[-1].last_id if producer_id is not None else 0
                bloom = self._bloom(group)
                sink.write_user_chunk(data, entries, records, producer_id, last_id, bloom)
                progress.chunks += 1
                sink.after_write()
            progress.batches += sum(p.batches for p in group)

    def _bloom(self, group: Sequence[_Piece]) -> bytes:
        """The bloom filter of a chunk made of ``group`` (osiris_log:make_chunk): none
        unless some entry carries a filter value; entries without one set bit 0."""
        if all(p.filters is None for p in group):
            return b""
        values: set[bytes] = set()
        for piece in group:
            values.update((UNFILTERED,) if piece.filters is None else piece.filters)
        return bloom_bytes(values, self._config.filter_size)


class _Piece(NamedTuple):
    """Entries bound for one chunk: a whole batch, its kept entries, or part of one."""

    data: bytes
    num_entries: int
    num_records: int
    last_id: int
    batches: int  # batches completed once this piece is written
    filters: frozenset[bytes] | None = None  # the entries' distinct filter values (v2)


def _filters(values: Sequence[str | None] | None) -> frozenset[bytes] | None:
    """The distinct filter values of Publish v2 entries as osiris inserts them (a null or
    empty value is ``UNFILTERED``); the set is built in C, only distinct values are encoded."""
    if values is None:
        return None
    return frozenset(UNFILTERED if v is None else v.encode("utf-8") for v in set(values))


def tracking_id(name: str | bytes, what: str) -> bytes:
    """A producer or consumer name as a tracking id (1..255 bytes)."""
    ident = name.encode("utf-8") if isinstance(name, str) else bytes(name)
    if not ident or len(ident) > MAX_ID_BYTES:
        raise InvalidAppendError(f"{what} must be 1..255 bytes")
    return ident


def check_publishing_ids(ids: Sequence[int]) -> None:
    for pid in ids:
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid <= MAX_U64:
            raise InvalidAppendError(f"publishing id {pid!r} is not a u64")


def kept_indexes(ids: Sequence[int], last: int) -> list[int] | None:
    """Deduplication (as Osiris keeps them): the indexes of the ids above ``last`` and
    above every earlier id; None when that is all of them (checked in C, the usual case)."""
    if ids and ids[0] > last and all(map(operator.lt, ids, itertools.islice(ids, 1, None))):
        return None
    kept: list[int] = []
    for i, pid in enumerate(ids):
        if pid > last:
            kept.append(i)
            last = pid
    return kept


def _others(ids: Sequence[int], kept: list[int]) -> list[int]:
    keep = set(kept)
    return [pid for i, pid in enumerate(ids) if i not in keep]


def chunk_ranges(
    sizes: Sequence[int], limit: int, counts: Sequence[int] | None = None
) -> list[tuple[int, int]]:
    """Chunk splitting: index ranges of consecutive items (sizes in bytes, ``counts``
    entries each, default 1) forming chunks within ``limit`` bytes and 65535 entries.
    An item over the limit gets a range of its own (its write then refuses it)."""
    n = len(sizes)
    if not n:
        return []
    entries = n if counts is None else sum(counts)
    if entries <= MAX_ENTRIES_PER_CHUNK and sum(sizes) <= limit:
        return [(0, n)]
    ranges: list[tuple[int, int]] = []
    lo = acc = acc_entries = 0
    for i, size in enumerate(sizes):
        count = 1 if counts is None else counts[i]
        if i > lo and (acc + size > limit or acc_entries + count > MAX_ENTRIES_PER_CHUNK):
            ranges.append((lo, i))
            lo, acc, acc_entries = i, 0, 0
        acc += size
        acc_entries += count
    ranges.append((lo, n))
    return ranges


def _entry_sizes(entries: list[Entry], plain: bool) -> list[int]:
    """Encoded sizes of entries (header included)."""
    if plain:
        return [4 + n for n in map(len, entries)]  # type: ignore[arg-type]
    return [
        SUB_BATCH_HEADER_SIZE + len(e.data) if isinstance(e, SubBatch) else 4 + len(e)
        for e in entries
    ]
