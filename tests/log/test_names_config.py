"""Stream directory names and LogConfig validation."""

from __future__ import annotations

import os

import pytest

from tierlog.errors import ConfigError
from tierlog.log.config import LogConfig
from tierlog.log.errors import InvalidStreamNameError, NotAStreamError, StreamExistsError
from tierlog.log.names import created_ns_of, stream_dir_name, validate_dir_name
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.writer import StreamLog


def test_dir_name_like_rabbitmq() -> None:
    assert stream_dir_name("/", "orders", 1700000000000000000) == "__orders_1700000000000000000"
    assert stream_dir_name("prod", "a.b-c", 5) == "prod_a.b-c_5"
    assert stream_dir_name("v+1", "s", 1) == "v-1_s_1"
    assert created_ns_of("__orders_1700000000000000000") == 1700000000000000000


@pytest.mark.parametrize(
    "name", ["", "a/b", "..", ".", "a\\b", "a\x00b", "x" * 256, "../etc", "a..b", "tab\there"]
)
def test_bad_stream_names(name: str) -> None:
    with pytest.raises(InvalidStreamNameError):
        stream_dir_name("/", name, 1)


@pytest.mark.parametrize("vhost", ["", "a\\b", "..", "v\x00", "/" + "x" * 300])
def test_bad_vhosts(vhost: str) -> None:
    with pytest.raises(InvalidStreamNameError):
        stream_dir_name(vhost, "s", 1)


@pytest.mark.parametrize("dir_name", ["no_timestamp", "../x_1", ".hidden_1", "a/b_1", "x_"])
def test_bad_dir_names(dir_name: str) -> None:
    with pytest.raises(InvalidStreamNameError):
        validate_dir_name(dir_name)


def test_bad_created_timestamp() -> None:
    with pytest.raises(InvalidStreamNameError):
        stream_dir_name("/", "s", -1)


def test_create_stays_inside_data_dir(tmp_path: str) -> None:
    data = str(tmp_path)
    with StreamLog.create(data, "/", "s", created_ns=42) as log:
        assert os.path.dirname(log.stream_dir) == data
    with pytest.raises(StreamExistsError):
        StreamLog.create(data, "/", "s", created_ns=42)
    with pytest.raises(InvalidStreamNameError):
        StreamLog.create(data, "/", "../escape", created_ns=1)
    assert sorted(os.listdir(data)) == ["__s_42"]


def test_open_rejects_non_streams(tmp_path: str) -> None:
    with pytest.raises(NotAStreamError):
        StreamLog.open(str(tmp_path))
    with pytest.raises(NotAStreamError):
        StreamLog.open(os.path.join(str(tmp_path), "missing"))
    junk = os.path.join(str(tmp_path), "junk")
    os.mkdir(junk)
    with open(os.path.join(junk, "00000000000000000000.segment"), "wb") as f:
        f.write(b"this is not an osiris segment at all")
    with pytest.raises(NotAStreamError):
        StreamLog.open(junk)
    plain = os.path.join(str(tmp_path), "file")
    open(plain, "w").close()
    with pytest.raises(NotAStreamError):
        StreamLog.open(plain)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_segment_bytes": 0},
        {"max_segment_bytes": 2**33},
        {"max_segment_chunks": -1},
        {"max_chunk_bytes": 100, "max_record_bytes": 100},
        {"fsync": "sometimes"},
        {"fsync_interval_ms": 0},
        {"max_producers": 0},
        {"epoch": -1},
        {"epoch": True},
        {"max_record_bytes": 1.5},
    ],
)
def test_config_validation(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        LogConfig(**kwargs)  # type: ignore[arg-type]


def test_config_defaults() -> None:
    c = LogConfig()
    assert (c.max_segment_bytes, c.max_segment_chunks) == (500_000_000, 256_000)
    assert c.fsync == "chunk" and c.epoch == 1 and c.max_producers >= 1_000_000


def test_offset_spec_parse() -> None:
    assert OffsetSpec.parse("first") == OffsetSpec.first()
    assert OffsetSpec.parse("12") == OffsetSpec.offset(12)
    assert OffsetSpec.parse("ts:99") == OffsetSpec.timestamp(99)
    with pytest.raises(ConfigError):
        OffsetSpec.parse("yesterday")
    with pytest.raises(ConfigError):
        OffsetSpec.offset(-1)
