"""A new leader's epoch snapshot keeps the consumer offsets below its local log (pure
log files, no server). The soak's "consumers" oracle found a stored offset answered as
none (or as an older MetaStore value) after leader changes: the epoch's first chunk is a
tracking snapshot, written before the new leader's tierer told the log where the stream
starts, so it trimmed offsets at the local log's first offset, which a tiered stream's
short local retention moves past every consumer that is behind."""

from __future__ import annotations

from pathlib import Path

from tests.log.acceptor_helpers import SMALL
from tierlog.log.writer import StreamLog
from tierlog.server.cluster_gates import start_epoch


def test_a_new_epoch_keeps_offsets_of_consumers_behind_the_local_log(tmp_path: Path) -> None:
    log = StreamLog.create(str(tmp_path / "leader"), "v", "s", SMALL, created_ns=1)
    try:
        log.append([b"first"])
        log.store_offset("behind", 0)
        for i in range(40):  # several segments (each begins with a tracking snapshot)
            log.append([b"more-%d" % i])
        log.sync()
        while log.first_offset <= 0 or len(log.segment_refs()) > 2:
            log.delete_segment(log.first_offset)  # local retention: tiered, freed
        assert log.first_offset > 0
        assert log.query_offset("behind") == 0
        start_epoch(log, log.tail()[0] + 1)  # elected before its tierer resolved
        assert log.query_offset("behind") == 0
    finally:
        log.close()
