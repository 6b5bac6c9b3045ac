"""The garbage-collection rule (``remote/gc.py``) on its own: each reason to keep an
object, and the multipart uploads it aborts."""

from __future__ import annotations

import uuid

from tierlog.remote import keys
from tierlog.remote.gc import GcView, Verdict, attempt_name, judge, uploads_to_abort
from tierlog.storage.object_store import ObjectMeta, PendingUpload

INC = "%2F_s_1"
NOW = 10_000.0
OLD = NOW - 100.0


def view(**changes: object) -> GcView:
    base = {
        "prefix": "",
        "live": True,
        "referenced": frozenset(),
        "pending": frozenset(),
        "in_flight": frozenset(),
        "tail_from": 1000,
        "now": NOW,
        "grace_seconds": 50.0,
    }
    base.update(changes)
    return GcView(**base)  # type: ignore[arg-type]


def obj(key: str, written: float | None = OLD) -> ObjectMeta:
    return ObjectMeta(key, 10, last_modified=written)


def test_each_reason_to_keep_and_garbage_otherwise() -> None:
    fragment = keys.fragment_key("", INC, 0)
    root = keys.root_key("", INC, keys.new_uid())
    seg_uuid = uuid.uuid4()
    segment = keys.segment_data_key("", INC, 0, seg_uuid)
    assert judge(obj(root), view()) is Verdict.GARBAGE
    assert judge(obj(root), view(referenced=frozenset({root}))) is Verdict.REFERENCED
    assert judge(obj(root), view(pending=frozenset({root}))) is Verdict.PENDING
    in_flight = frozenset({attempt_name(0, seg_uuid.hex)})
    assert judge(obj(segment), view(in_flight=in_flight)) is Verdict.IN_FLIGHT
    assert judge(obj(segment), view()) is Verdict.GARBAGE
    tail = keys.fragment_key("", INC, 1000)
    assert judge(obj(tail), view()) is Verdict.PROTECTED_TAIL
    assert judge(obj(tail), view(live=False, tail_from=None)) is Verdict.GARBAGE
    assert judge(obj(fragment), view()) is Verdict.GARBAGE
    assert judge(obj(fragment, NOW - 10), view()) is Verdict.YOUNG
    assert judge(obj(fragment, None), view()) is Verdict.YOUNG  # unknown age: doubt
    assert judge(obj(f"stream/{INC}/dict/{'ab' * 16}.dict"), view()) is Verdict.UNKNOWN


def test_only_uploads_older_than_the_grace_are_aborted() -> None:
    uploads = [
        PendingUpload("a", "1", initiated=OLD),
        PendingUpload("b", "2", initiated=NOW - 10),
        PendingUpload("c", "3", initiated=None),
    ]
    assert [u.key for u in uploads_to_abort(uploads, NOW, 50.0)] == ["a"]
