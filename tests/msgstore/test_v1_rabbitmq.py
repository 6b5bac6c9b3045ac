"""Reading RabbitMQ's own v1 message store (tests/data/rabbitmq_msgstore, made by
scripts/make_msgstore_fixture.py with a real RabbitMQ node), dumping it without touching
it, and migrating it to v2 with a crash at every step."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tierlog.cli import main
from tierlog.msgstore import MessageStore
from tierlog.msgstore.dump import dump
from tierlog.msgstore.files import RABBIT_INDEX_FILE
from tierlog.msgstore.migrate import MIGRATION_STEPS, migrate_v1

pytestmark = pytest.mark.rabbitmq

FIXTURE = Path(__file__).parent.parent / "data" / "rabbitmq_msgstore"


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    return json.loads((FIXTURE / "expected.json").read_text())


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    target = tmp_path / "msg_store_persistent"
    shutil.copytree(FIXTURE / "msg_store_persistent", target)
    return target


def _sha(payload_holder: bytes, entry: dict[str, Any]) -> bool:
    """Whether a stored body holds the payload of ``entry`` verbatim."""
    prefix = entry["prefix"].encode()
    at = payload_holder.find(prefix)
    if at < 0:
        return False
    payload = payload_holder[at : at + entry["size"]]
    return hashlib.sha256(payload).hexdigest() == entry["sha256"]


def _snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


def test_fixture_has_several_files(expected: dict[str, Any]) -> None:
    assert len(expected["rdq_files"]) >= 3
    assert expected["live"] and expected["acked"]


def test_store_reads_live_and_never_acked(store_dir: Path, expected: dict[str, Any]) -> None:
    store = MessageStore.open(store_dir)
    assert store.last_v1_file == len(expected["rdq_files"]) - 1
    assert store.v1_liveness_known
    bodies = [store.read(m) for m in store.msg_ids()]
    for entry in expected["live"]:
        assert sum(_sha(b, entry) for b in bodies) == 1, entry["prefix"]
    for entry in expected["acked"] + expected["embedded_in_queue_index"]:
        assert not any(_sha(b, entry) for b in bodies), entry["prefix"]
    assert len(store) == len(expected["live"])
    store.abandon()


def test_dump_marks_liveness_and_changes_nothing(store_dir: Path, expected: dict[str, Any]) -> None:
    before = _snapshot(store_dir)
    out = io.StringIO()
    assert dump(store_dir, out) == 0
    assert _snapshot(store_dir) == before
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert {line["type"] for line in lines} == {"V1_MESSAGE"}
    for entry in expected["live"]:
        hits = [ln for ln in lines if _sha(base64.b64decode(ln["body"]), entry)]
        assert [h["live"] for h in hits] == [True], entry["prefix"]
    for entry in expected["acked"]:
        hits = [ln for ln in lines if _sha(base64.b64decode(ln["body"]), entry)]
        assert hits and all(h["live"] is False for h in hits), entry["prefix"]


def test_without_rabbitmq_index_liveness_is_unknown(
    store_dir: Path, expected: dict[str, Any]
) -> None:
    os.unlink(store_dir / RABBIT_INDEX_FILE)
    out = io.StringIO()
    dump(store_dir, out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == len(expected["live"]) + len(expected["acked"])
    assert all(line["live"] is None for line in lines)
    store = MessageStore.open(store_dir)
    assert not store.v1_liveness_known and len(store) == len(lines)
    store.abandon()


def test_cli_dump_and_migrate(
    store_dir: Path, expected: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["msgstore", "dump", str(store_dir)]) == 0
    dumped = capsys.readouterr().out.splitlines()
    assert len(dumped) == len(expected["live"]) + len(expected["acked"])
    assert main(["msgstore", "migrate", str(store_dir)]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["v1_files"] == len(expected["rdq_files"])
    assert summary["messages"] == len(expected["live"])
    assert not list(store_dir.glob("*.rdq"))
    assert main(["msgstore", "dump", str(store_dir)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {line["type"] for line in lines} == {"MESSAGE_WITH_CHECKSUM"}
    assert all(line["live"] is True for line in lines)
    for entry in expected["live"]:
        assert sum(_sha(base64.b64decode(ln["body"]), entry) for ln in lines) == 1


def _check_migrated_contents(store: MessageStore, expected: dict[str, Any]) -> None:
    bodies = [store.read(m) for m in store.msg_ids()]
    assert len(bodies) == len(expected["live"])
    for entry in expected["live"]:
        assert sum(_sha(b, entry) for b in bodies) == 1, entry["prefix"]
    for entry in expected["acked"]:
        assert not any(_sha(b, entry) for b in bodies)


@pytest.mark.parametrize("occurrence", [0, 2])
@pytest.mark.parametrize("point", MIGRATION_STEPS)
def test_migration_crash_at_every_step(
    store_dir: Path, expected: dict[str, Any], point: str, occurrence: int
) -> None:
    seen = {"count": 0}

    def hook(name: str) -> None:
        if name == point:
            if seen["count"] == occurrence:
                raise RuntimeError(f"crash at {name}")
            seen["count"] += 1

    store = MessageStore.open(store_dir, crash_hook=hook)
    with pytest.raises(RuntimeError, match="crash at"):
        migrate_v1(store)
    store.abandon()
    store = MessageStore.open(store_dir)  # dirty recovery mid-migration
    assert not store.recovered_clean
    _check_migrated_contents(store, expected)
    migrate_v1(store)
    assert store.last_v1_file is None and not list(store_dir.glob("*.rdq"))
    assert not list(store_dir.glob("*.tmp"))
    _check_migrated_contents(store, expected)
    store.abandon()
    store = MessageStore.open(store_dir)  # dirty again, now all v2
    _check_migrated_contents(store, expected)
    store.close()
    store = MessageStore.open(store_dir)
    assert store.recovered_clean and store.last_v1_file is None
    _check_migrated_contents(store, expected)
    store.close()


def test_v1_files_drain_by_attrition(store_dir: Path, expected: dict[str, Any]) -> None:
    """Removing every live message of the store deletes the emptied v1 files; new writes
    go to v2 files numbered above the boundary."""
    store = MessageStore.open(store_dir)
    store.write(b"n" * 16, b"new")
    assert store.current_file == len(expected["rdq_files"])
    for msg_id in list(store.msg_ids()):
        if msg_id != b"n" * 16:
            store.remove(msg_id)
    assert not list(store_dir.glob("*.rdq")) and store.last_v1_file is None
    store.close()
    store = MessageStore.open(store_dir)
    assert store.read(b"n" * 16) == b"new" and len(store) == 1
    store.close()


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    assert main(["msgstore", "migrate", str(missing)]) == 1
    assert not missing.exists()
    assert main(["msgstore", "dump", str(missing)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "0.sqs").write_bytes(b"TLMS\x02" + bytes(59) + bytes(100))
    assert main(["msgstore", "migrate", str(corrupt)]) == 1
    assert "0.sqs" in capsys.readouterr().err
    assert main(["msgstore", "dump", str(corrupt)]) == 1
    line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert line["error"] == "ZeroFilledRegionError" and line["file"] == "0.sqs"
