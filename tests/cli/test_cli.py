"""The command line: ``tierlog dump`` and ``tierlog quickstart``."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from tierlog.cli import build_parser, main
from tierlog.formats.chunk import SubBatch
from tierlog.formats.compression import Compression, compress
from tierlog.log.config import LogConfig
from tierlog.log.writer import StreamLog


def sub_batch(code: int, records: list[bytes]) -> SubBatch:
    body = b"".join(len(r).to_bytes(4, "big") + r for r in records)
    return SubBatch(code, len(records), len(body), compress(code, body))


def run_cli(*args: str) -> tuple[int, list[dict[str, object]]]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(list(args))
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def test_dump_prints_every_user_record(tmp_path: Path) -> None:
    log = StreamLog.create(str(tmp_path), "/", "d", LogConfig(max_segment_chunks=3), created_ns=9)
    log.append([b"a", b"b"], producer="p", publishing_ids=[1, 2])
    log.store_offset("consumer", 1)
    log.append([sub_batch(Compression.GZIP, [b"g1", b"g2"]), b"c"])
    log.append([sub_batch(Compression.ZSTD, [b"z"])])
    log.append([b"last"])
    stream_dir = log.stream_dir
    log.close()
    code, rows = run_cli("dump", stream_dir)
    assert code == 0
    assert [base64.b64decode(str(r["body"])) for r in rows] == [
        b"a",
        b"b",
        b"g1",
        b"g2",
        b"c",
        b"z",
        b"last",
    ]
    offsets = [r["offset"] for r in rows]
    assert offsets == [0, 1, 3, 4, 5, 7, 8]  # gaps: tracking chunks (delta, snapshot)
    assert set(rows[0]) == {"offset", "chunk_id", "timestamp", "epoch", "body"}
    assert [r["chunk_id"] for r in rows] == [0, 0, 3, 3, 3, 7, 8]
    assert all(r["epoch"] == 1 for r in rows)


def test_dump_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump", str(tmp_path)]) == 1
    assert "no Osiris segment files" in capsys.readouterr().err
    log = StreamLog.create(str(tmp_path), "/", "u", created_ns=1)
    log.append([b"ok", SubBatch(6, 1, 3, b"???")])
    stream_dir = log.stream_dir
    log.close()
    assert main(["dump", stream_dir]) == 1
    err = capsys.readouterr().err
    assert "code-6" in err and "not supported" in err


def test_parser_has_subcommands() -> None:
    parser = build_parser()
    assert parser.parse_args(["dump", "x"]).command == "dump"
    with pytest.raises(SystemExit):
        parser.parse_args([])


def test_quickstart_and_module_entry_point(tmp_path: Path) -> None:
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "tierlog", "quickstart", "--local-only"]
    cmd += ["--records", "2500", "--batch", "1000"]
    first = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert "appended 2500 records in 3 chunks" in first.stdout
    assert "read back 2500 records" in first.stdout
    data = tmp_path / "tierlog-data"
    (stream,) = os.listdir(data)
    assert stream.startswith("__quickstart_")
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert "opened stream" in again.stdout and "previous: 2499" in again.stdout
    dump = subprocess.run(
        [sys.executable, "-m", "tierlog", "dump", str(data / stream)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert len(dump.stdout.splitlines()) == 5000


def test_server_quickstart_tiers_and_reads_back_from_the_remote_tier(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tierlog", "quickstart", "--records", "10000"]
    first = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "published 10000 messages with rstream, all confirmed" in first.stdout
    assert "now live only in the object store" in first.stdout
    assert "consumed 10000 messages from 'first'" in first.stdout
    remote = int(first.stdout.split("consumed 10000 messages")[1].split(": ")[1].split(" ")[0])
    assert remote > 0  # some came back from the remote tier
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "consumed 20000 messages from 'first'" in again.stdout
