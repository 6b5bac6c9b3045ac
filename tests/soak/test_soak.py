"""The soak's CI profile (``tests/soak/profile.py: ci_profile``): about three minutes of
the everything-on soak (three ``tierlog serve`` nodes on tmpfs data directories, etcd,
SeaweedFS behind the S3 fault proxy, one stream of every kind, producers, consumers on
leaders, members and non-members, a Spark batch read at the end) with every fault kind
about once. It fails when any of the soak's oracles fails; the printed report names each
failed oracle, why, and with which fault.

While the defects the soak found are open the test is an expected failure, strict: once
they are fixed it passes, the strict xfail turns that into a failure and the marker must
go (``TIERLOG_SOAK_STRICT=1`` runs it as a plain test meanwhile).
``TIERLOG_SOAK_NO_FAULTS=kind,kind`` leaves fault kinds out (e.g. on a branch where a
fix has not landed); ``TIERLOG_SOAK_SEED`` picks another schedule. The long runs are
``scripts/soak.py --minutes M`` (docs/reliability.md, "The everything-on soak")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.seaweed import SeaweedServer
from tests.soak.mounts import MARK
from tests.soak.profile import ci_profile, parse_faults
from tests.soak.run import run_soak

pytestmark = [pytest.mark.etcd, pytest.mark.s3, pytest.mark.spark]

OPEN_DEFECTS = (
    "on main at ae620ca every run finds (docs/reliability.md, 'The everything-on soak'):"
    " a member whose disk was full never catches up; members never free disk; retirement"
    " never completes with an ack=remote stream; stored consumer offsets go back; Spark's"
    " tail read works only through the leader; orphan roots after an etcd cut; a stall"
    " report on a retiring node; a deleted stream left in the cluster directory"
)


@pytest.mark.xfail(
    not os.environ.get("TIERLOG_SOAK_STRICT"),
    reason=OPEN_DEFECTS,
    raises=AssertionError,
    strict=True,
)
@pytest.mark.timeout(900)
async def test_soak_ci_profile(
    tmp_path_factory: pytest.TempPathFactory,
    etcd_server: str,
    seaweed: SeaweedServer,
    spark: Any,
) -> None:
    faults = parse_faults(None, [os.environ.get("TIERLOG_SOAK_NO_FAULTS", "")])
    profile = ci_profile(int(os.environ.get("TIERLOG_SOAK_SEED", "7")), faults)
    workdir: Path = tmp_path_factory.mktemp(MARK)
    result, text = await run_soak(profile, workdir, etcd_server, seaweed, lambda: spark, print)
    print(text)
    assert not result.failures, text
    assert result.tally.confirmed > 0
    assert {f.kind for f in result.faults} >= set(faults) - {"s3-errors"}, "every kind drawn"
