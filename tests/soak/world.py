"""The soak's parts: three ``tierlog serve`` nodes (``tests.cluster.nodes.Cluster``: each
reaching etcd and taking replication links through its own proxy) whose data directories
are size-limited tmpfs mounts, SeaweedFS behind the S3 fault proxy, users with only the
permissions of their role, and one encryption key shared with Spark's executors."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.cluster.nodes import Cluster, Node
from tests.plugins.s3_fault_proxy import FaultProxy
from tests.plugins.seaweed import SeaweedServer
from tests.plugins.spark import EXECUTOR_KEKS
from tests.soak.mounts import TmpfsMount, clean_stale_mounts
from tests.soak.profile import Profile
from tierlog.remote.encryption import Keyring, process_keyring, set_process_keyring

NAMES = ("n1", "n2", "n3")
ADMIN = ("guest", "guest")  # the harness itself (stream set-up, admin API checks)
PRODUCER = ("soak-producer", "producer-secret")
CONSUMER = ("soak-consumer", "consumer-secret")
SPARK = ("soak-spark", "spark-secret")
CHURN = ("soak-churn", "churn-secret")
KEK_ID, KEK = EXECUTOR_KEKS.split(":", 1)
S3_FAULT_KINDS = {"500": 3.0, "503": 3.0, "reset": 2.0, "lost_reply": 1.0, "delay": 1.0}


def extra_config() -> str:
    """Appended to each node's config: users with one role each (producers only write,
    consumers and Spark only read, churn manages its own streams), the key of encrypted
    streams, and a stall watchdog short enough to matter in a soak."""
    return f"""
[store]
task_stall_seconds = 60

[auth]
users = {{ guest = "guest", {PRODUCER[0]} = "{PRODUCER[1]}", {CONSUMER[0]} = "{CONSUMER[1]}", \
{SPARK[0]} = "{SPARK[1]}", {CHURN[0]} = "{CHURN[1]}" }}
loopback_users = ["guest"]

[auth.permissions.{PRODUCER[0]}]
"/" = {{ configure = "", write = "^soak-.*", read = "" }}

[auth.permissions.{CONSUMER[0]}]
"/" = {{ configure = "", write = "", read = "^soak-.*" }}

[auth.permissions.{SPARK[0]}]
"/" = {{ configure = "", write = "", read = "^soak-.*" }}

[auth.permissions.{CHURN[0]}]
"/" = {{ configure = "^soak-churn-.*", write = "^soak-churn-.*", read = "^soak-churn-.*" }}

[encryption]
keys = {{ {KEK_ID} = "base64:{KEK}" }}
"""


def gc_env(profile: Profile) -> dict[str, str]:
    """The nodes collect their own garbage past the oracle's grace period, every 5 s."""
    return {
        "TIERLOG_TIER_GC_GRACE_SECONDS": str(profile.orphan_grace_s),
        "TIERLOG_TIER_GC_INTERVAL_SECONDS": "5",
    }


class SoakWorld:
    """Everything a run needs; ``close()`` stops and unmounts it all (call it from a
    ``finally``)."""

    def __init__(
        self, workdir: Path, etcd_endpoint: str, seaweed: SeaweedServer, profile: Profile
    ) -> None:
        self.workdir = workdir
        self.profile = profile
        self.stale_mounts = clean_stale_mounts()
        self.proxy = FaultProxy(seaweed.endpoint, seed=profile.seed, kinds=S3_FAULT_KINDS)
        self.proxy.start()
        self.proxy.configure(kinds=S3_FAULT_KINDS, delay_s=(0.05, 0.5))
        self.seaweed = seaweed
        proxied = dataclasses.replace(seaweed, endpoint=self.proxy.endpoint)
        self.cluster = Cluster(
            workdir / "nodes",
            etcd_endpoint,
            proxied,
            names=NAMES,
            proxied_etcd=True,
            replicated=True,
            proxied_replication=True,
        )
        # the harness and Spark read the bucket directly, not through the fault proxy
        self.direct_object_uri = self.cluster.object_uri.replace(
            self.proxy.endpoint, seaweed.endpoint
        )
        os.environ.setdefault("TIERLOG_KEKS", EXECUTOR_KEKS)
        # the harness's own bucket walks (orphans) open sealed objects: the process
        # keyring is read once, maybe already by an earlier test without keys, so it is
        # set here and the earlier one restored on close
        self._keyring_before = process_keyring()
        set_process_keyring(Keyring.from_environment())
        os.environ.setdefault("AWS_ACCESS_KEY_ID", seaweed.access_key)  # gc's bucket walk
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
        os.environ.setdefault("AWS_REGION", seaweed.region)
        self.mounts: dict[str, TmpfsMount] = {}
        try:
            for name, node in self.cluster.nodes.items():
                node.process.config_text += extra_config()
                node.process.extra_env.update(gc_env(profile))
                self.mounts[name] = TmpfsMount(node.process.data_dir, profile.mount_mb).mount()
        except BaseException:
            self.close()
            raise

    def start(self) -> SoakWorld:
        """Every node at once (each start waits until it listens: three in a row cost
        three start-ups of wall time)."""
        with ThreadPoolExecutor(len(self.cluster.nodes)) as pool:
            list(pool.map(lambda node: node.process.start(), self.cluster.nodes.values()))
        return self

    def node(self, name: str) -> Node:
        return self.cluster.node(name)

    def s3_errors(self, on: bool) -> None:
        self.proxy.configure(rate=self.profile.s3_error_rate if on else 0.0)

    def close(self) -> None:
        set_process_keyring(self._keyring_before)
        try:
            with contextlib.suppress(Exception):
                self.cluster.close()
        finally:
            for mount in self.mounts.values():
                mount.unmount()
            self.proxy.stop()
