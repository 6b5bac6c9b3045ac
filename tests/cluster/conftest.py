"""Fixtures of the cluster tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.cluster.hub_helpers import Cluster


@pytest.fixture
async def hubs() -> AsyncIterator[Cluster]:
    """In-process replication hubs on loopback (``await hubs.add("n1")``), all stopped
    after the test."""
    cluster = Cluster()
    yield cluster
    await cluster.stop()
