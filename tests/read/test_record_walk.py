"""Both readers hand out records through ``ChunkRead.records`` (the one entry walk of
``formats.chunk``): mixed chunks, attach offsets inside a chunk, damage typed by tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlog.formats.chunk import Entry, SubBatch, decode_header, encode_chunk, encode_records
from tierlog.log.errors import CorruptChunkError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import ChunkRead, LogReader
from tierlog.log.writer import StreamLog
from tierlog.read.errors import RemoteDataCorruptError
from tierlog.read.tiered_reader import TieredChunk, TieredReader

_PAYLOAD = encode_records([b"c1", b"c22", b"c333"])
MIXED: list[Entry] = [b"a", b"bb", SubBatch(0, 3, len(_PAYLOAD), _PAYLOAD), b"dddd", b""]
MIXED_RECORDS = [b"a", b"bb", b"c1", b"c22", b"c333", b"dddd", b""]


def _chunk() -> tuple[memoryview, int, int]:
    raw = memoryview(encode_chunk(0, 100, 1, 0, MIXED, trailer=b"TRAILER"))
    header = decode_header(raw)
    return raw, header.data_start, header.data_start + header.data_length


def _damaged(chunk_type: type[ChunkRead]) -> ChunkRead:
    raw, start, _end = _chunk()
    damaged = bytearray(raw)
    damaged[start : start + 4] = (10_000).to_bytes(4, "big")  # first length too long
    header = decode_header(damaged)
    if chunk_type is TieredChunk:
        return TieredChunk(header, "k", 0, memoryview(damaged), 0, "remote")
    return ChunkRead(header, "p", 0, memoryview(damaged), 0)


def test_chunk_reads_type_damage_by_tier() -> None:
    with pytest.raises(CorruptChunkError):
        list(_damaged(ChunkRead).records())
    with pytest.raises(RemoteDataCorruptError):
        list(_damaged(TieredChunk).records())


def test_readers_hand_out_mixed_chunks_and_skip_below_the_attach_offset(tmp_path: Path) -> None:
    log = StreamLog.create(str(tmp_path), "v", "s")
    try:
        log.append([b"x" * n for n in range(1, 5)])  # simple entries of varied length
        log.append(MIXED)
        log.append([b"same"] * 3)  # uniform: the C-iterator path
        expected = [b"x" * n for n in range(1, 5)] + MIXED_RECORDS + [b"same"] * 3
        offsets = list(range(len(expected)))
        for attach in (0, 6):
            log_reader = LogReader(log, OffsetSpec.offset(attach))
            tiered = TieredReader(log, None, OffsetSpec.offset(attach))
            for reader in (log_reader, tiered):
                got = list(reader.records())
                assert [o for o, _ in got] == offsets[attach:]
                assert [bytes(r) for _, r in got] == expected[attach:]
                reader.close()
    finally:
        log.close()
