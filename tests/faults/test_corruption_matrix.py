"""The corruption matrix: every registered file kind x {bit flip, truncation, zero-filled
page, deleted}, on a stream with data in both tiers; hypothesis picks the file and position.

Oracle: every confirmed record is read back exactly once, in order (intact or repaired), or
the stream / read is refused with a typed error (naming the file for local files); only a
torn tail of the last local segment may be cut; no healthy file is deleted; no offset is
handed out twice. Outcomes are counted so that "refuse everything" cannot pass.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.faults.cold_kinds  # registers the encrypted file kinds
import tests.faults.kinds  # noqa: F401  (registers the file kinds)
from tests.faults.kinds import META_POINTER
from tests.faults.registry import DAMAGES, FILE_KINDS, Target
from tests.faults.stream import (
    ENCRYPTED_CAMPAIGN,
    CampaignStream,
    Outcome,
    build,
    restart_and_read,
)
from tierlog.errors import TierlogError
from tierlog.remote.catalog import pointer_key
from tierlog.storage.sqlite_meta_store import SqliteMetaStore

PAGE = 4096
OUTCOMES: collections.Counter[str] = collections.Counter()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> CampaignStream:
    return build(str(tmp_path_factory.mktemp("matrix") / "pristine"))


@pytest.fixture(scope="module")
def pristine_encrypted(tmp_path_factory: pytest.TempPathFactory) -> CampaignStream:
    """The same stream with cold settings (compressed, dictionary, encrypted) and a key
    index, for the encrypted file kinds."""
    return build(str(tmp_path_factory.mktemp("matrix") / "encrypted"), encrypted=True)


def damage_file(target: Target, how: str, at: int, bit: int, stream: CampaignStream) -> None:
    if target.path == META_POINTER:
        damage_pointer(stream, how, at, bit)
        return
    if how == "delete":
        os.unlink(target.path)
        return
    size = os.path.getsize(target.path)
    pos = min(target.start + at % max(1, target.end - target.start), size - 1)
    if how == "truncate":
        os.truncate(target.path, pos)
        return
    with open(target.path, "r+b") as f:
        if how == "bitflip":
            f.seek(pos)
            byte = f.read(1)[0]
            f.seek(pos)
            f.write(bytes([byte ^ (1 << bit)]))
        else:  # a zero-filled page (a lost write-back)
            page = pos - pos % PAGE
            f.seek(page)
            f.write(bytes(min(PAGE, size - page)))


def damage_pointer(stream: CampaignStream, how: str, at: int, bit: int) -> None:
    meta = SqliteMetaStore(stream.meta_path)
    try:
        key = pointer_key(stream.incarnation)
        stored = meta.get(key)
        assert stored is not None
        value = bytearray(stored.value)
        if how == "delete":
            meta.delete(key)
            return
        pos = at % len(value)
        if how == "bitflip":
            value[pos] ^= 1 << bit
        elif how == "truncate":
            del value[pos:]
        else:
            value = bytearray(len(value))
        meta.put_if(key, bytes(value), stored.version, stored.epoch)
    finally:
        meta.close()


def files_of(stream: CampaignStream) -> set[str]:
    return {n for n in os.listdir(stream.stream_dir) if n.endswith((".segment", ".index"))}


def judge(
    stream: CampaignStream, target: Target, how: str, outcome: Outcome, before: set[str]
) -> str:
    confirmed = stream.confirmed
    damaged = os.path.basename(target.path)
    # no healthy local file deleted (the damaged one may be moved aside or rebuilt)
    after = files_of(stream) | {n.removesuffix(".damaged") for n in os.listdir(stream.stream_dir)}
    pair = {damaged, damaged.replace(".segment", ".index"), damaged.replace(".index", ".segment")}
    missing = {n for n in before - after if n not in pair}
    assert not missing, f"healthy files deleted: {missing}"
    if outcome.error is not None:
        assert isinstance(outcome.error, TierlogError)
        if target.local:
            assert damaged in str(outcome.error) or any(
                damaged in p for p in outcome.report.moved_aside
            ), f"refusal does not name {damaged}: {outcome.error!r}"
        return "refused"
    got = outcome.records
    offsets = [o for o, _ in got]
    assert offsets == sorted(set(offsets)), "a record was served twice or out of order"
    if got == confirmed:
        assert outcome.next_offset is not None and outcome.next_offset >= stream.next_offset
        return "repaired" if outcome.report.repaired else "intact"
    # only a torn tail of the last local segment may be cut: a prefix, nothing skipped
    last_segment = sorted(n for n in before if n.endswith(".segment"))[-1]
    assert target.local and damaged == last_segment, (
        f"{how} of {damaged}: served {len(got)} of {len(confirmed)} confirmed records"
    )
    assert got == confirmed[: len(got)], "records skipped or changed"
    return "cut"


def judge_lookup(stream: CampaignStream, outcome: Outcome) -> None:
    """A key lookup that was not refused returns exactly the pristine stream's records."""
    if stream.encrypted and outcome.error is None:
        assert outcome.lookup == stream.lookup_expected, "a key lookup returned wrong records"


@settings(
    max_examples=int(os.environ.get("MATRIX_EXAMPLES_PER_CELL", "3")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize(
    "kind_name",
    sorted(k for k, v in FILE_KINDS.items() if v.campaign in ("tiered-stream", ENCRYPTED_CAMPAIGN)),
)
def test_corruption_matrix(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    kind_name: str,
    how: str,
    data: st.DataObject,
) -> None:
    kind = FILE_KINDS[kind_name]
    encrypted = kind.campaign == ENCRYPTED_CAMPAIGN
    pristine = request.getfixturevalue("pristine_encrypted" if encrypted else "pristine")
    stream = pristine.copy_to(str(tmp_path / "copy"))
    targets = FILE_KINDS[kind_name].locate(stream)
    assert targets, f"no {kind_name} in the campaign stream"
    target = data.draw(st.sampled_from(targets), label="file")
    at = data.draw(st.integers(0, 1 << 30), label="position")
    bit = data.draw(st.integers(0, 7), label="bit")
    before = files_of(stream)
    damage_file(target, how, at, bit, stream)
    outcome = restart_and_read(stream)
    verdict = judge(stream, target, how, outcome, before)
    judge_lookup(stream, outcome)
    OUTCOMES[f"{kind_name}/{how}/{verdict}"] += 1
    OUTCOMES[verdict] += 1


def test_matrix_repairs_more_than_it_refuses() -> None:
    """Runs after the matrix (file order): refusing everything cannot pass. Local files
    have a healthy copy for most of their range (the remote tier), so there most faults
    must be survived; remote-only data and the MetaStore pointer have no second copy."""
    if not OUTCOMES:
        pytest.skip("run together with the matrix")
    summary = "\n".join(f"{k}: {v}" for k, v in sorted(OUTCOMES.items()))
    print("corruption matrix outcomes:\n" + summary)
    assert OUTCOMES["repaired"] > 0, summary
    for kind in FILE_KINDS.values():
        if not kind.repairable or kind.campaign != "tiered-stream":
            continue
        counts = {
            verdict: sum(
                v
                for k, v in OUTCOMES.items()
                if k.startswith(kind.name + "/") and k.endswith("/" + verdict)
            )
            for verdict in ("intact", "repaired", "cut", "refused")
        }
        survived = counts["intact"] + counts["repaired"]
        assert survived >= counts["refused"], f"{kind.name}: {counts}\n{summary}"
