"""``tierlog spark scrub``: verify every fragment and every manifest of the remote tier.

The driver walks each live stream's committed manifest (root, every branch object, each
node checked against the entry that points to it: kind, height, stream, first/next
offset, timestamps, byte/chunk/fragment totals). The fragments are then read by Spark
tasks, one task per run of consecutive fragments (up to ``target_bytes``), which check
the whole object (``validate_fragment``: header, trailer, index and metadata CRC, every
chunk header against its index record and every chunk's data CRC; a v2 fragment's frames
are decoded with the stream's dictionary and key, so a missing dictionary or key is a
problem too) and the trailer
against the manifest entry (first/next offset, min/max timestamp, data size, chunk
count). A fragment that is missing, corrupt or disagrees with the manifest is a problem
of its stream; so is a gap, which shows up as a trailer whose range differs from its
entry's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tierlog.formats.chunk import decode_header
from tierlog.formats.crc import crc32
from tierlog.formats.errors import FormatError, UnknownKeyError
from tierlog.formats.fragment_v2 import FragmentIndexV2
from tierlog.formats.offload_sealed import decode_data_header
from tierlog.remote.catalog import Catalog
from tierlog.remote.dictionaries import validate_stored_fragment
from tierlog.remote.errors import CorruptFragmentError, MissingDictionaryError
from tierlog.remote.fragments import FragmentEntry, trailer_mismatch
from tierlog.remote.segments import read_segment_index, run_chunks
from tierlog.spark.jobs.common import (
    Progress,
    RemoteTier,
    run_distributed,
    select_streams,
    walk_manifest,
)
from tierlog.storage.errors import NotFoundError, StorageError

DEFAULT_TARGET_BYTES = 256 * 1024 * 1024
MAX_FRAGMENTS_PER_TASK = 512


@dataclass(frozen=True)
class FragmentRange:
    """The unit of work of one task: consecutive fragments of one stream."""

    stream: str
    fragments: tuple[FragmentEntry, ...]
    sealed: bool = False  # the stream's pointer says its manifest is sealed


@dataclass
class RangeResult:
    stream: str
    fragments: int = 0
    bytes: int = 0
    problems: list[dict[str, str]] = field(default_factory=list)


@dataclass
class StreamScrub:
    vhost: str
    name: str
    incarnation: str
    first_offset: int = 0
    next_offset: int = 0
    branches: int = 0
    fragments: int = 0
    bytes: int = 0
    problems: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "vhost": self.vhost,
            "name": self.name,
            "incarnation": self.incarnation,
            "first_offset": self.first_offset,
            "next_offset": self.next_offset,
            "branches": self.branches,
            "fragments_checked": self.fragments,
            "bytes_checked": self.bytes,
            "problems": self.problems,
        }


@dataclass
class ScrubReport:
    streams: list[StreamScrub]

    @property
    def ok(self) -> bool:
        return not any(s.problems for s in self.streams)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": "scrub",
            "ok": self.ok,
            "problems": sum(len(s.problems) for s in self.streams),
            "streams": [s.to_dict() for s in self.streams],
        }


def check_range(tier: RemoteTier, work: FragmentRange) -> RangeResult:
    """Task body: read and fully validate each fragment of the range."""
    result = RangeResult(work.stream)
    with tier.open_store() as store:
        for ref in work.fragments:
            result.fragments += 1
            problem = check_fragment(store, ref, sealed=work.sealed)
            if problem is None:
                result.bytes += ref.data_size
            else:
                result.problems.append(problem)
    return result


def check_fragment(
    store: Any, ref: FragmentEntry, *, sealed: bool = False
) -> dict[str, str] | None:
    """None if the fragment is intact and matches its manifest entry, else the problem.
    ``sealed``: the manifest naming it is sealed, so an offloaded segment must be too."""
    if ref.is_segment:
        return check_segment(store, ref, sealed=sealed)
    try:
        data = store.get(ref.key)
    except NotFoundError:
        return {"kind": "missing-fragment", "key": ref.key, "detail": "referenced but absent"}
    except StorageError as exc:
        return {"kind": "unreadable-fragment", "key": ref.key, "detail": str(exc)}
    try:
        index = validate_stored_fragment(store, ref.key, data)
    except FormatError as exc:
        return {"kind": "corrupt-fragment", "key": ref.key, "detail": str(exc)}
    except MissingDictionaryError as exc:
        return {"kind": "missing-dictionary", "key": ref.key, "detail": str(exc)}
    except CorruptFragmentError as exc:  # its dictionary or key is unusable
        return {"kind": "undecodable-fragment", "key": ref.key, "detail": str(exc)}
    if sealed and not (isinstance(index, FragmentIndexV2) and index.encrypted):
        detail = "plaintext fragment where the stream's manifest names encrypted ones only"
        return {"kind": "corrupt-fragment", "key": ref.key, "detail": detail}
    mismatch = trailer_mismatch(ref, index.trailer)
    if mismatch:
        return {"kind": "fragment-mismatch", "key": ref.key, "detail": mismatch}
    return None


def check_segment(store: Any, ref: FragmentEntry, *, sealed: bool = False) -> dict[str, str] | None:
    """None if an offloaded segment's index object matches its manifest entry and every
    chunk of its data object is intact (entry header, chunk header, whole-chunk CRC)."""
    try:
        index = read_segment_index(store, ref, require_sealed=sealed)
        data = store.get_view(ref.key)
    except NotFoundError as exc:
        return {"kind": "missing-fragment", "key": ref.key, "detail": f"referenced: {exc}"}
    except StorageError as exc:
        return {"kind": "unreadable-fragment", "key": ref.key, "detail": str(exc)}
    except CorruptFragmentError as exc:
        kind = "undecodable-fragment" if isinstance(exc.__cause__, UnknownKeyError) else None
        return {"kind": kind or "corrupt-fragment", "key": ref.index_key, "detail": str(exc)}
    if len(data) != index.trailer.index_start:
        detail = f"data object of {len(data)} bytes, the index says {index.trailer.index_start}"
        return {"kind": "corrupt-fragment", "key": ref.key, "detail": detail}
    records = index.records
    try:
        if index.entries.sealed:  # the header's key block must be the one the index holds
            key_block = decode_data_header(data)
            if key_block != index.entries.key_block:
                raise FormatError("data object header's key block differs from the index's")
        chunks = run_chunks(index, 0, len(records), data, base=0)
        for i, (chunk_id, crc) in enumerate(
            zip(records["chunk_id"].tolist(), records["crc"].tolist(), strict=True)
        ):
            chunk = chunks[i]
            if decode_header(chunk).chunk_id != chunk_id:
                raise FormatError(f"chunk {i} is not chunk {chunk_id}")
            if crc32(chunk) != crc:
                raise FormatError(f"chunk {chunk_id}: CRC of its bytes does not match")
    except FormatError as exc:
        return {"kind": "corrupt-fragment", "key": ref.key, "detail": str(exc)}
    return None


def plan_ranges(
    stream: str, fragments: list[FragmentEntry], target_bytes: int, *, sealed: bool = False
) -> list[FragmentRange]:
    """Cut a stream's fragments into runs of about ``target_bytes`` each."""
    ranges: list[FragmentRange] = []
    run: list[FragmentEntry] = []
    size = 0
    for ref in fragments:
        if run and (size + ref.data_size > target_bytes or len(run) >= MAX_FRAGMENTS_PER_TASK):
            ranges.append(FragmentRange(stream, tuple(run), sealed))
            run, size = [], 0
        run.append(ref)
        size += ref.data_size
    if run:
        ranges.append(FragmentRange(stream, tuple(run), sealed))
    return ranges


def run_scrub(
    spark: Any,
    tier: RemoteTier,
    streams: list[str] | None = None,
    *,
    vhost: str = "/",
    target_bytes: int = DEFAULT_TARGET_BYTES,
    progress: Progress | None = None,
) -> ScrubReport:
    """Scrub the named streams of ``vhost`` (default: every live stream)."""
    say = progress or Progress("scrub")
    results: dict[str, StreamScrub] = {}
    ranges: list[FragmentRange] = []
    with tier.open_meta() as meta, tier.open_store() as store:
        catalog = Catalog(meta)
        records = select_streams(catalog, streams, vhost)
        say(f"walking the manifests of {len(records)} stream(s)")
        for record in records:
            walk = walk_manifest(store, catalog, tier.prefix, record.incarnation)
            scrub = StreamScrub(
                record.vhost,
                record.name,
                record.incarnation,
                walk.first_offset,
                walk.next_offset,
                len(walk.branch_keys),
                problems=list(walk.problems),
            )
            results[record.incarnation] = scrub
            sealed = walk.pointer is not None and walk.pointer.sealed
            ranges += plan_ranges(record.incarnation, walk.fragments, target_bytes, sealed=sealed)
    fragments = sum(len(r.fragments) for r in ranges)
    say(f"checking {fragments} fragment(s) in {len(ranges)} task(s)")
    for done in run_distributed(
        spark, ranges, lambda work: check_range(tier, work), "tierlog scrub: fragments"
    ):
        scrub = results[done.stream]
        scrub.fragments += done.fragments
        scrub.bytes += done.bytes
        scrub.problems += done.problems
    report = ScrubReport(list(results.values()))
    say(f"done: {report.to_dict()['problems']} problem(s)")
    return report
