"""The soak's CI profile (``tests/soak/profile.py: ci_profile``): about three minutes of
the everything-on soak (three ``tierlog serve`` nodes on tmpfs data directories, etcd,
SeaweedFS behind the S3 fault proxy, one stream of every kind, producers, consumers on
leaders, members and non-members, a Spark batch read at the end) with every fault kind
about once. It fails when any of the soak's oracles fails; the printed report names each
failed oracle, why, and with which fault.

Oracles with open defects (``KNOWN_OPEN``, each named with its defect) are reported
but do not fail this test: every other oracle — every confirmed message read back once and
in order through every member and Spark, delayed messages once and never early, each
member caught up within the bound after each fault, no process crash, no unexplained
ERROR, no watchdog report — fails it, as does any failure of a known-open oracle of a
kind not listed. ``TIERLOG_SOAK_STRICT=1`` asserts every oracle (the acceptance run).
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

KNOWN_OPEN = {
    "faults": "retiring a node: the ack=remote case is fixed (tests/cluster/"
    "test_nodes_retire_remote_ack.py); a plain RF 3 stream under one-message frames was"
    " once seen stuck the same way and is not diagnosed, so the oracle is reported only",
    "resources": "disk growth over a two-minute profile measures the first data written,"
    " not a leak (the long profile judges growth after warm-up)",
}
"""Oracle -> the open defect that makes it fail today (docs/reliability.md, soak)."""


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
    strict = os.environ.get("TIERLOG_SOAK_STRICT", "0").strip() not in ("", "0")
    failing = {k: v for k, v in result.failures.items() if strict or k not in KNOWN_OPEN}
    # of the faults oracle only a retirement that does not complete is known open
    other_faults = [why for why in result.failures.get("faults", []) if "retire" not in why]
    if other_faults and not strict:
        failing["faults"] = other_faults
    assert not failing, text
    for oracle in sorted(set(result.failures) & set(KNOWN_OPEN)):
        print(f"known open ({KNOWN_OPEN[oracle]}): {result.failures[oracle]}")
    assert result.tally.lost == result.tally.duplicated == result.tally.out_of_order == 0
    assert result.tally.confirmed > 0
    assert {f.kind for f in result.faults} >= set(faults) - {"s3-errors"}, "every kind drawn"
