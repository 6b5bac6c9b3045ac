"""StreamLog.append_encoded: pre-encoded Osiris entry data written as one chunk."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.logs import log_records_at as records
from tierlog.formats.chunk import SubBatch, encode_entries, encode_records
from tierlog.formats.protocol.publish import decode_publish, encode_publish
from tierlog.log.config import LogConfig
from tierlog.log.errors import InvalidAppendError, LogClosedError, RecordTooLargeError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.recovery import recover
from tierlog.log.writer import StreamLog


def make(tmp_path: Path, **kw: object) -> StreamLog:
    return StreamLog.create(str(tmp_path), "/", "s", LogConfig(**kw), created_ns=1)  # type: ignore[arg-type]


def test_plain_and_sub_batch_data_round_trip(tmp_path: Path) -> None:
    log = make(tmp_path)
    r1 = log.append_encoded(encode_records([b"a", b"bb", b"ccc"]), 3, 3)
    assert (r1.first_offset, r1.last_offset, r1.chunk_ids, r1.dedup_chunk_id) == (0, 2, (0,), None)
    inner = encode_records([b"x", b"y"])
    data, n_entries, n_records = encode_entries([SubBatch(0, 2, len(inner), inner), b"z"])
    r2 = log.append_encoded(memoryview(data), n_entries, n_records)
    assert (r2.first_offset, r2.last_offset) == (3, 5)
    assert records(log) == [(0, b"a"), (1, b"bb"), (2, b"ccc"), (3, b"x"), (4, b"y"), (5, b"z")]
    log.close()
    assert not recover(log.stream_dir, repair=False).notes  # CRC and entries are valid


def test_producer_sequence_goes_to_trailer_and_tracking(tmp_path: Path) -> None:
    log = make(tmp_path)
    data = encode_records([b"m"] * 4)
    result = log.append_encoded(
        data, 4, 4, producer="app", first_publishing_id=10, last_publishing_id=13
    )
    assert result.dedup_chunk_id == 0
    assert log.producer_sequence("app") == 13
    # the log refuses overlapping ids: nothing is written
    with pytest.raises(InvalidAppendError):
        log.append_encoded(
            data, 4, 4, producer="app", first_publishing_id=13, last_publishing_id=20
        )
    with pytest.raises(InvalidAppendError):
        log.append_encoded(data, 4, 4, producer="app", last_publishing_id=13)
    assert log.next_offset == 4
    log.append_encoded(data, 4, 4, producer=b"app", last_publishing_id=14)
    # the general append sees the same sequence
    assert log.append([b"old"], "app", [14]).dropped == (14,)
    log.close()
    reopened = StreamLog.open(log.stream_dir)
    assert reopened.producer_sequence("app") == 14
    reopened.close()


@pytest.mark.parametrize(
    ("data", "entries", "records_", "error"),
    [
        (encode_records([b"a", b"b"]), 3, 3, InvalidAppendError),  # fewer entries than said
        (encode_records([b"a", b"b"]) + b"\x00", 2, 2, InvalidAppendError),  # trailing byte
        (encode_records([b"a", b"b"]), 2, 3, InvalidAppendError),  # wrong record count
        (encode_records([b"a", b"bb"])[:-1], 2, 2, InvalidAppendError),  # truncated entry
        (b"", 0, 0, InvalidAppendError),
        (encode_records([b"x" * 101]), 1, 1, RecordTooLargeError),
        (encode_records([b"x" * 101, b"y"]), 2, 2, RecordTooLargeError),
    ],
)
def test_bad_data_is_refused_before_writing(
    tmp_path: Path, data: bytes, entries: int, records_: int, error: type[Exception]
) -> None:
    log = make(tmp_path, max_record_bytes=100, max_chunk_bytes=1000)
    with pytest.raises(error):
        log.append_encoded(data, entries, records_)
    assert log.next_offset == 0
    log.append_encoded(encode_records([b"fine"]), 1, 1)
    assert records(log) == [(0, b"fine")]
    log.close()


def test_limits_and_argument_checks(tmp_path: Path) -> None:
    log = make(tmp_path, max_record_bytes=100, max_chunk_bytes=1000)
    with pytest.raises(InvalidAppendError):  # over one chunk: the caller splits
        log.append_encoded(encode_records([b"x" * 90] * 11), 11, 11)
    with pytest.raises(InvalidAppendError):
        log.append_encoded(encode_records([b"a"]), 1, 1, last_publishing_id=1)
    with pytest.raises(InvalidAppendError):
        log.append_encoded(encode_records([b"a"]), 1, 1, producer="p")
    with pytest.raises(InvalidAppendError):
        log.append_encoded(
            encode_records([b"a"]), 1, 1, producer="p", first_publishing_id=5, last_publishing_id=4
        )
    with pytest.raises(InvalidAppendError):
        log.append_encoded(encode_records([b"a"]), 1, 1, producer="p", last_publishing_id=-1)
    assert log.next_offset == 0
    log.close()
    with pytest.raises(LogClosedError):
        log.append_encoded(encode_records([b"a"]), 1, 1)


def test_append_gate_refuses_without_writing(tmp_path: Path) -> None:
    log = make(tmp_path)

    class Refused(Exception):
        pass

    def gate() -> None:
        raise Refused

    log.set_append_gate(gate)
    with pytest.raises(Refused):
        log.append_encoded(encode_records([b"a"]), 1, 1)
    log.set_append_gate(None)
    assert log.next_offset == 0
    log.close()


def test_large_chunks_use_the_background_crc(tmp_path: Path) -> None:
    """Chunks over 64 KiB are written data-first with the CRC from the helper thread."""
    log = make(tmp_path, max_segment_bytes=400_000)
    batch = [bytes([i % 251]) * 1000 for i in range(100)]
    for _ in range(6):
        log.append(batch)
    log.append_encoded(encode_records(batch), 100, 100)
    log.close()
    recovered = recover(log.stream_dir, repair=False)
    assert not recovered.notes and recovered.next_offset == 700
    assert len(recovered.segments) > 1
    reopened = StreamLog.open(log.stream_dir)
    with reopened.reader(OffsetSpec.first(), verify_crc="always") as r:
        got = [bytes(b) for _, b in r.records()]
    assert got == batch * 7
    reopened.close()


@pytest.mark.parametrize("path", ["append", "append_encoded", "append_records", "append_batches"])
def test_every_append_path_passes_the_gate(tmp_path: Path, path: str) -> None:
    """The back-pressure gate guards all append paths alike: nothing is written while
    it refuses, whichever way the records come in."""
    log = make(tmp_path)

    class Refused(Exception):
        pass

    calls: list[str] = []

    def gate() -> None:
        calls.append(path)
        raise Refused

    log.set_append_gate(gate)
    with pytest.raises(Refused):
        if path == "append":
            log.append([b"a", b"b"])
        elif path == "append_encoded":
            log.append_encoded(encode_records([b"a", b"b"]), 2, 2)
        elif path == "append_records":
            log.append_records([b"a", b"b"])
        else:
            batch = decode_publish(memoryview(encode_publish(1, [(1, b"a"), (2, b"b")]))[4:])
            log.append_batches([batch], "app")
    assert calls == [path]
    assert log.next_offset == 0
    log.set_append_gate(None)
    log.close()
