"""The cross-tier reader's read-ahead over offloaded segments: when the index object of a
later segment cannot be loaded, read-ahead stops there (where its entries lie is unknown)
and the reader loads the index again when it gets there, then reads on from a new stream."""

from __future__ import annotations

import random
from pathlib import Path

from tests.faults.object_store import FaultyObjectStore
from tests.offload.test_service import Stream, local_records, read_all
from tierlog.log.offset_spec import OffsetSpec
from tierlog.remote.settings import StreamSettings
from tierlog.storage.fs_object_store import FsObjectStore


def test_failed_segment_index_read_ahead_is_retried_when_the_reader_gets_there(
    tmp_path: Path,
) -> None:
    store = FaultyObjectStore(FsObjectStore(str(tmp_path / "objects")))
    settings = StreamSettings(
        tier_mode="segments", offload_threshold_bytes=0, offload_deletion_lag_seconds=0.0
    )
    s = Stream(str(tmp_path), store, settings, 60_000)
    try:
        s.append(random.Random(21), 120)
        expected = local_records(s.log, OffsetSpec.first())
        assert s.service.run_once() >= 3
        s.service.apply_local_deletion()
        tree = s.service.committed_tree()
        entries = [loc.entry for loc in tree.iter_fragments(s.store.get)]
        assert len(entries) >= 3 and all(e.is_segment for e in entries)
        second = entries[1]
        expected = [(o, r) for o, r in expected if o < tree.next_offset]  # offloaded only
        assert len(expected) > 100
        store.reset_log()
        store.fail_nth("get", 1, key_prefix=second.index_key)  # its first index load
        assert read_all(s.reader(OffsetSpec.first(), local=False)) == expected
        loads = [r.outcome for r in store.log if r.key == second.index_key]
        assert loads[0].startswith("injected-before") and loads[1:] == ["ok"]
    finally:
        s.close()
