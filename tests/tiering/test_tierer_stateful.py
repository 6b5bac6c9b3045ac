"""A stateful property test of the whole tiering shell: a real local log, the real
filesystem object store behind fault injection, a real SQLite MetaStore; random appends,
injected failures (before and after the operation took effect), crashes and restarts,
and local retention — checking the durability invariants after every step."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.plugins.tiering_world import SMALL, World
from tierlog.storage.fs_object_store import FsObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore
from tierlog.tiering.tierer import StreamTierer


class TieringShellMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="tierlog-stateful-"))
        self.meta = SqliteMetaStore(str(self.tmp / "meta.db"))
        self.world = World(self.tmp, FsObjectStore(self.tmp / "objects"), self.meta)
        self.tierer = self._start()
        self.max_durable = 0
        self.freed_below = 0

    def _start(self) -> StreamTierer:
        tierer = StreamTierer(
            self.world.log,
            self.world.store,
            self.world.catalog,
            self.world.deletions,
            config=SMALL,
            m=3,
        )
        self.world.tierers.append(tierer)
        tierer.start()
        return tierer

    @rule(batches=st.integers(1, 6), size=st.integers(10, 2000))
    def append(self, batches: int, size: int) -> None:
        self.world.append(batches, per_batch=7, size=size)

    @rule(
        op=st.sampled_from(["put_if_absent", "get_suffix", "get"]),
        after=st.booleans(),
        nth=st.integers(1, 3),
        times=st.integers(1, 3),
    )
    def inject_fault(self, op: str, after: bool, nth: int, times: int) -> None:
        self.world.store.fail_nth(op, nth, after=after and op == "put_if_absent", times=times)

    @rule()
    def outage(self) -> None:
        """The object store refuses every upload until healed."""
        self.world.store.fail_nth("put_if_absent", 1, times=10**9)

    @rule()
    def heal(self) -> None:
        self.world.store.clear_faults()

    @rule()
    def flush(self) -> None:
        self.tierer.flush(timeout=1.0)

    @rule()
    def crash_and_restart(self) -> None:
        self.tierer.stop(flush=False, timeout=5)
        self.world.store.clear_faults()  # the restarted writer must be able to resolve
        self.tierer = self._start()
        assert self.tierer.halted is None

    @rule(max_bytes=st.sampled_from([1, 20_000, 200_000]))
    def local_retention(self, max_bytes: int) -> None:
        freed = self.tierer.apply_local_retention(max_bytes, None)
        event(f"freed={bool(freed)} sealed={sum(s.sealed for s in self.world.log.list_segments())}")
        if freed:
            self.freed_below = self.world.log.list_segments()[0].first_offset

    @invariant()
    def durable_never_goes_back_and_is_never_reused(self) -> None:
        durable = self.tierer.durable_next
        assert durable >= self.max_durable
        self.max_durable = durable
        assert self.world.log.next_offset >= durable  # no tiered offset is ever reused
        # Nothing freed locally that is not durable remotely.
        assert self.freed_below <= durable

    @invariant()
    def manifest_matches_the_log(self) -> None:
        assert self.tierer.halted is None, self.tierer.halted
        tree = self.tierer.committer.tree
        rules, self.world.store.rules = self.world.store.rules, []  # the checker sees no faults
        try:
            remote = self.world.remote_chunks(self.tierer)  # decoding checks every CRC
            fragments = list(tree.iter_fragments(self.tierer.remote.load))
        finally:
            self.world.store.rules = rules
        local = self.world.local_chunks()
        expected_ids = [cid for cid in local if cid < tree.next_offset]
        for cid in expected_ids:
            assert remote[cid] == local[cid]  # identical bytes where both are held
        if remote:
            assert min(remote) == tree.first_offset == 0
        # Contiguous: every offset below next is in exactly one fragment.
        total = 0
        for loc in fragments:
            assert loc.entry.first_offset == total
            total = loc.next_offset
        assert total == tree.next_offset

    def teardown(self) -> None:
        try:
            self.world.store.clear_faults()
            assert self.tierer.flush(timeout=30)
            assert self.tierer.durable_next == self.world.log.commit_point().next_offset
        finally:
            self.world.close()
            self.meta.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


profile = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
TieringShellMachine.TestCase.settings = settings(
    profile, max_examples=min(profile.max_examples, 30), stateful_step_count=25
)
TestTieringShell = TieringShellMachine.TestCase
