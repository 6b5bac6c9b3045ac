"""The garbage-collection rule: which objects of one stream incarnation may be deleted,
and which of its incomplete multipart uploads aborted. Pure: the caller lists, walks and
reads; this module only decides. The server's scheduled collection
(``server/gc_service.py``) and ``tierlog spark gc`` both run it through
``tiering/gc.py``, so there is one rule.

An object is kept when it is

* referenced by the committed manifest of a live incarnation (root, branches, fragments,
  offloaded segments' data and index);
* pending deletion (the deletion queue deletes it after its own grace, for readers);
* an offloaded segment of an offload attempt still recorded in the MetaStore (in flight;
  its owner commits it or its recovery deletes it);
* a fragment at or after a live incarnation's committed next offset (a restarting writer
  adopts an existing fragment at its remote tail instead of uploading it again);
* not a key this module knows (compression dictionaries, key-index files: they go with
  the stream's prefix when the stream is deleted);
* younger than the grace period, or of unknown age (never deletes on doubt).

Everything else is garbage. The grace period is what makes this safe against a writer
that is still working: an object it uploaded but has not yet committed is unreferenced
until the commit. So the grace period must be longer than the longest time between a
writer starting an upload and committing the root that names it, plus the longest
collection of one incarnation (the walk happens before the listing). Deleted
incarnations (not in the catalog) have no manifest: everything older than the grace
period goes.

Multipart uploads are never adopted by anybody (offload recovery aborts them), so an
upload initiated more than the grace period ago is abandoned and is aborted; one whose
start time the store does not report is kept.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tierlog.remote import keys
from tierlog.storage.errors import InvalidKeyError
from tierlog.storage.object_store import ObjectMeta, PendingUpload


class Verdict(enum.Enum):
    REFERENCED = "referenced"
    PENDING = "pending_deletion"
    IN_FLIGHT = "offload_in_flight"
    PROTECTED_TAIL = "protected_tail"
    UNKNOWN = "unknown"
    YOUNG = "younger_than_grace"
    GARBAGE = "garbage"


@dataclass(frozen=True, slots=True)
class GcView:
    """What a collection knows about one incarnation when it judges its objects.

    ``tail_from`` is the committed next offset of a live incarnation (None for a deleted
    one); ``in_flight`` holds ``{first:020d}.{uuid hex}`` of every recorded offload
    attempt (see ``attempt_names``)."""

    prefix: str
    live: bool
    referenced: frozenset[str]
    pending: frozenset[str]
    in_flight: frozenset[str]
    tail_from: int | None
    now: float
    grace_seconds: float


def attempt_name(first_offset: int, uuid_hex: str) -> str:
    """How an offload attempt is named in ``GcView.in_flight``."""
    return f"{first_offset:020d}.{uuid_hex}"


def judge(obj: ObjectMeta, view: GcView) -> Verdict:
    """The verdict on one listed object (see the module docstring)."""
    key = obj.key
    try:
        parsed = keys.parse_key(key, view.prefix)
    except InvalidKeyError:
        return Verdict.UNKNOWN
    if key in view.referenced:
        return Verdict.REFERENCED
    if key in view.pending:
        return Verdict.PENDING
    if isinstance(parsed, keys.SegmentKey) and (
        attempt_name(parsed.first_offset, parsed.uuid.hex) in view.in_flight
    ):
        return Verdict.IN_FLIGHT
    if (
        view.tail_from is not None
        and isinstance(parsed, keys.FragmentKey)
        and parsed.first_offset >= view.tail_from
    ):
        return Verdict.PROTECTED_TAIL
    if obj.last_modified is None or view.now - obj.last_modified < view.grace_seconds:
        return Verdict.YOUNG
    return Verdict.GARBAGE


def uploads_to_abort(
    uploads: Iterable[PendingUpload], now: float, grace_seconds: float
) -> Iterator[PendingUpload]:
    """The incomplete multipart uploads initiated more than ``grace_seconds`` ago."""
    for upload in uploads:
        if upload.initiated is not None and now - upload.initiated >= grace_seconds:
            yield upload
