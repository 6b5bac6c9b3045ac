"""Shared test configuration: hypothesis profiles and the real-server plugins."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

pytest_plugins = [
    "tests.plugins.seaweed",
    "tests.plugins.s3_fault_proxy",
    "tests.plugins.etcd",
    "tests.plugins.tiering_world",
    "tests.plugins.tierlog_server",
    "tests.plugins.spark",
    "tests.plugins.node_client",
    "tests.plugins.area_timing",
]
