"""Chunks with bloom filters as osiris writes them are read, and a filtering reader skips
the ones their bloom rules out.

The chunks are built here byte by byte from ``osiris_log:make_chunk/7``'s layout (header with
the bloom size in byte 44, the bloom, the entries), with bloom bytes produced by osiris's own
``osiris_bloom.erl`` on Erlang/OTP 25 — nothing comes from tierlog's writer — and taken in
through the acceptor, the path a replica of a RabbitMQ-written stream would use.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from tierlog.formats.bloom import ChunkFilter
from tierlog.formats.chunk import HEADER_SIZE
from tierlog.formats.protocol.publish import PublishBatch, decode_publish, encode_publish
from tierlog.log.config import LogConfig
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.writer import StreamLog

# osiris_bloom:to_binary/1 outputs (tests/formats/test_bloom.py has where they come from)
APPLE_16 = bytes.fromhex("04000000000000000000040000000000")
APPLE_BANANA_16 = bytes.fromhex("04000100000000000000060000000000")
APPLE_UNFILTERED_16 = bytes.fromhex("84000000000000000000040000000000")
INVOICES_Z_32 = bytes.fromhex("0001000010000000000000000000080001000800040000000000000000000000")


def osiris_chunk(chunk_id: int, records: list[bytes], bloom: bytes) -> bytes:
    """osiris_log:make_chunk of simple entries: <<5:4, 0:4, 0:8, NumEntries:16,
    NumRecords:32, Timestamp:64, Epoch:64, ChunkId:64, Crc:32, Size:32, TSize:32,
    BloomSize:8, 0:24>>, BloomData, EData (no trailer)."""
    data = b"".join(struct.pack(">I", len(r)) + r for r in records)
    header = struct.pack(
        ">BBHIqQQIIIB3x",
        0x50,
        0,
        len(records),
        len(records),
        1_700_000_000_000 + chunk_id,
        1,
        chunk_id,
        zlib.crc32(data),
        len(data),
        0,
        len(bloom),
    )
    return header + bloom + data


BLOOMS = [APPLE_16, INVOICES_Z_32, b"", APPLE_BANANA_16, bytes(8), APPLE_UNFILTERED_16]
"""Chunk i has bloom BLOOMS[i]; ``bytes(8)`` is malformed (osiris writes 16..255 bytes)."""


def _log(tmp_path: Path) -> StreamLog:
    log = StreamLog.create(str(tmp_path / "s"), "/", "s", created_ns=1)
    raw = b"".join(
        osiris_chunk(i * 2, [f"r{i}a".encode(), f"r{i}b".encode()], bloom)
        for i, bloom in enumerate(BLOOMS)
    )
    assert log.accept_chunks(raw) == 2 * len(BLOOMS)
    log.sync_to_disk()
    return log


def _read(log: StreamLog, chunk_filter: ChunkFilter | None, load: bool = True) -> list[int]:
    ids = []
    with LogReader(log, OffsetSpec.first(), chunk_filter=chunk_filter) as reader:
        while (chunk := reader.read_chunk(load=load)) is not None:
            ids.append(chunk.header.chunk_id)
            if load:
                assert next(bytes(r) for _, r in chunk.records()).startswith(b"r")
    return ids


def test_osiris_chunks_with_blooms_read_whole(tmp_path: Path) -> None:
    log = _log(tmp_path)
    try:
        assert _read(log, None) == [0, 2, 4, 6, 8, 10]
        records = []
        with LogReader(log, OffsetSpec.first()) as reader:
            for chunk in iter(reader.read_chunk, None):
                records += [bytes(r) for _, r in chunk.records()]
        assert records[:4] == [b"r0a", b"r0b", b"r1a", b"r1b"]
    finally:
        log.close()


def test_a_filtering_reader_skips_what_the_bloom_rules_out(tmp_path: Path) -> None:
    log = _log(tmp_path)
    try:
        for load in (True, False):  # sendfile readers (header only) skip the same chunks
            # apple: its chunks, and the malformed bloom (may match), never the rest
            assert _read(log, ChunkFilter([b"apple"]), load) == [0, 6, 8, 10]
            # banana: only the chunk holding it (and the malformed one)
            assert _read(log, ChunkFilter([b"banana"]), load) == [6, 8]
            # invoices-us in a 32-byte bloom: matched with hashes for 32 bytes
            assert _read(log, ChunkFilter([b"invoices-us"]), load) == [2, 8]
            # match-unfiltered adds the chunk without a bloom and the one with bit 0
            unfiltered = ChunkFilter([b"cherry"], match_unfiltered=True)
            assert _read(log, unfiltered, load) == [4, 8, 10]
    finally:
        log.close()


def _publish(pairs: list[tuple[int, bytes]], values: list[str | None] | None) -> PublishBatch:
    return decode_publish(encode_publish(1, pairs, filter_values=values)[4:])


def _bloom_of_chunks(log: StreamLog) -> list[bytes]:
    blooms = []
    with LogReader(log, OffsetSpec.first()) as reader:
        for chunk in iter(reader.read_chunk, None):
            assert chunk.raw is not None
            blooms.append(bytes(chunk.raw[HEADER_SIZE : chunk.header.data_start]))
    return blooms


def test_blooms_follow_dedup_and_chunk_splits(tmp_path: Path) -> None:
    """A duplicate's filter value never reaches the bloom; a batch split over chunks gives
    each chunk the bloom of its own entries; frames merged into one chunk share one."""
    log = StreamLog.create(
        str(tmp_path / "w"), "/", "w", LogConfig(max_chunk_bytes=4096, max_record_bytes=2048)
    )
    try:
        log.append_batches([_publish([(1, b"a"), (2, b"b")], ["apple", "banana"])], "p")
        # id 2 again (a duplicate, banana) and id 3 (apple): only apple is written
        log.append_batches([_publish([(2, b"b"), (3, b"c")], ["banana", "apple"])], "p")
        # two frames written together: one chunk, the union (apple and unfiltered)
        log.append_batches([_publish([(4, b"d")], ["apple"]), _publish([(5, b"e")], None)], "p")
        # one frame over a chunk: split; the first part is all apple, the second banana
        big = [(6 + i, bytes(1500)) for i in range(4)]
        log.append_batches([_publish(big, ["apple", "apple", "banana", "banana"])], "p")
        blooms = _bloom_of_chunks(log)
        assert blooms[:3] == [APPLE_BANANA_16, APPLE_16, APPLE_UNFILTERED_16]
        assert blooms[3] == APPLE_16
        assert all(b == blooms[-1] for b in blooms[4:]) and blooms[-1] != APPLE_16
        assert ChunkFilter([b"banana"]).may_match(blooms[-1])
    finally:
        log.close()
