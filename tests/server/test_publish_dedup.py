"""The broker's publish path (pre-encoded chunks, ``StreamLog.append_encoded``):
duplicates inside and across frames of one group, mixed runs, splitting, oversize frames."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.support.logs import log_records as records
from tierlog.formats.chunk import decode_chunk
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import (
    decode_publish,
    encode_publish,
    encode_publish_entries,
    subbatch_entry,
    subbatch_records,
)
from tierlog.formats.tracking import TrackingType, decode_delta
from tierlog.log.config import LogConfig
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.writer import StreamLog
from tierlog.remote.catalog import StreamRecord
from tierlog.remote.settings import StreamSettings
from tierlog.server.broker import StreamHandle, _PublishOp, _StoreOffsetOp

SEQUENCE = TrackingType.SEQUENCE


def handle(tmp_path: Path, **config: Any) -> StreamHandle:
    cfg = LogConfig(fsync="never", **config)
    log = StreamLog.create(str(tmp_path), "/", "s", cfg, created_ns=1)
    record = StreamRecord("/", "s", "inc", 1, StreamSettings(), 1)
    return StreamHandle(record, log, None, ThreadPoolExecutor(1))  # type: ignore[arg-type]


def op(messages: list[tuple[int, bytes]], reference: str | None = "app") -> _PublishOp:
    batch = decode_publish(memoryview(encode_publish(1, messages))[4:])
    return _PublishOp(batch, reference, lambda code: None, len(batch.entry_data()))


def trailers(log: StreamLog) -> list[dict[bytes, int]]:
    """The producer sequences in each user chunk's trailer."""
    out = []
    with log.reader(OffsetSpec.first()) as r:
        for chunk in r.chunks():
            entries = decode_delta(chunk.trailer)
            out.append({ident: value for kind, ident, value in entries if kind == SEQUENCE})
    return out


def test_group_with_duplicates_inside_and_across_frames(tmp_path: Path) -> None:
    h = handle(tmp_path)
    ops = [
        op([(1, b"a"), (2, b"b"), (3, b"c")]),
        op([(3, b"dup3"), (4, b"d"), (4, b"dup4"), (2, b"dup2"), (5, b"e")]),  # 3 duplicates
        op([(1, b"x"), (2, b"y")]),  # all duplicates
        op([(6, b"f"), (7, b"g")]),
    ]
    result = h._write_group(ops)
    assert result.codes == [ResponseCode.OK] * 4
    assert result.duplicates == 5
    assert result.chunks == 1
    assert records(h.log) == [b"a", b"b", b"c", b"d", b"e", b"f", b"g"]
    assert h.log.producer_sequence("app") == 7
    assert trailers(h.log) == [{b"app": 7}]
    # a later group (a reconnect) resending old ids: dropped, nothing written
    again = h._write_group([op([(5, b"old"), (7, b"old")]), op([(8, b"h")])])
    assert again.duplicates == 2 and again.chunks == 1
    assert records(h.log)[-1:] == [b"h"]
    h.log.close()
    reopened = StreamLog.open(h.log.stream_dir)
    assert reopened.producer_sequence("app") == 8  # tracking comes back from the trailer
    reopened.close()


def test_unnamed_and_named_runs_and_store_offset(tmp_path: Path) -> None:
    h = handle(tmp_path)
    ops: list[Any] = [
        op([(1, b"p1"), (1, b"p1-again")], reference=None),  # no dedup without a name
        op([(9, b"n9")]),
        _StoreOffsetOp("reader", 1),
        op([(9, b"n9-dup"), (10, b"n10")]),
    ]
    result = h._write_group(ops)
    assert result.codes == [ResponseCode.OK] * 4
    assert records(h.log) == [b"p1", b"p1-again", b"n9", b"n10"]
    assert h.log.query_offset("reader") == 1
    assert result.duplicates == 1
    h.log.close()


def test_run_is_split_at_max_chunk_bytes(tmp_path: Path) -> None:
    h = handle(tmp_path, max_chunk_bytes=4096, max_record_bytes=4000)
    ops = [op([(i * 10 + k, b"%04d" % (i * 10 + k) * 100) for k in range(5)]) for i in range(6)]
    result = h._write_group(ops)
    assert result.codes == [ResponseCode.OK] * 6
    assert result.chunks > 1
    assert len(records(h.log)) == 30
    with h.log.reader(OffsetSpec.first()) as r:
        for chunk in r.chunks():
            assert chunk.header.data_length <= 4096
            assert chunk.raw is not None
            decode_chunk(chunk.raw)  # CRC and sizes consistent
    assert trailers(h.log)[-1] == {b"app": 54}
    h.log.close()


def test_oversize_record_fails_only_its_frame(tmp_path: Path) -> None:
    h = handle(tmp_path, max_chunk_bytes=4096, max_record_bytes=1000)
    ops = [op([(1, b"ok1")]), op([(2, b"x" * 2000)]), op([(3, b"ok3")])]
    result = h._write_group(ops)
    assert result.codes == [ResponseCode.OK, ResponseCode.PRECONDITION_FAILED, ResponseCode.OK]
    assert records(h.log) == [b"ok1", b"ok3"]  # nothing written twice, nothing lost
    assert h.log.producer_sequence("app") == 3
    h.log.close()


def test_oversize_unnamed_frame_is_split_by_the_log(tmp_path: Path) -> None:
    h = handle(tmp_path, max_chunk_bytes=4096, max_record_bytes=4000)
    big = op([(i, b"%03d" % i * 100) for i in range(5)], reference=None)  # 1.5 KB: fits
    bigger = op([(i, b"%03d" % i * 300) for i in range(8)], reference=None)  # 7.2 KB > 4 KiB
    result = h._write_group([big, bigger])
    assert result.codes == [ResponseCode.OK, ResponseCode.OK]
    assert len(records(h.log)) == 13
    assert result.chunks >= 3
    h.log.close()


def test_sub_batch_entries_pass_through(tmp_path: Path) -> None:
    h = handle(tmp_path)
    inner = subbatch_records([b"r1", b"r2", b"r3"])
    entry = subbatch_entry(inner, 3, len(inner))
    frame = encode_publish_entries(1, [1, 2], [entry, b"\x00\x00\x00\x02s1"])
    batch = decode_publish(memoryview(frame)[4:])
    ops = [_PublishOp(batch, "app", lambda code: None, len(batch.entry_data()))]
    dup = decode_publish(memoryview(encode_publish_entries(1, [2, 3], [entry, entry]))[4:])
    ops.append(_PublishOp(dup, "app", lambda code: None, len(dup.entry_data())))
    result = h._write_group(ops)
    assert result.codes == [ResponseCode.OK, ResponseCode.OK] and result.duplicates == 1
    assert records(h.log) == [b"r1", b"r2", b"r3", b"s1", b"r1", b"r2", b"r3"]
    assert h.log.next_offset == 7
    h.log.close()


def test_handle_runs_in_an_event_loop(tmp_path: Path) -> None:
    """The StreamHandle built here is usable as the broker builds it (sanity for the helper)."""

    async def main() -> None:
        h = handle(tmp_path)
        assert not h.congested
        h.executor.shutdown()
        h.log.close()

    asyncio.run(main())
