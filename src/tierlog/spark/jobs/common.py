"""What every Spark maintenance job shares: where the remote tier is, the Spark session,
progress lines, and a checked walk of a stream's manifest tree.

Jobs run their I/O inside Spark tasks, so the remote tier travels to the executors as a
small picklable ``RemoteTier`` (URIs, key prefix and store options such as S3
credentials read from the driver's environment) and every task opens its own stores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from tierlog.errors import TierlogError
from tierlog.formats.errors import FormatError
from tierlog.formats.manifest import KIND_ROOT, decode_node
from tierlog.remote import keys
from tierlog.remote.catalog import Catalog, ManifestPointer, StreamRecord
from tierlog.remote.committed import read_committed_root
from tierlog.remote.fragments import FragmentEntry
from tierlog.remote.manifest_walk import ManifestWalker
from tierlog.storage.errors import TransientError
from tierlog.storage.meta_store import MetaStore, open_meta_store
from tierlog.storage.object_store import ObjectStore, open_object_store

_S3_CREDENTIALS = (
    ("access_key_id", "AWS_ACCESS_KEY_ID"),
    ("secret_access_key", "AWS_SECRET_ACCESS_KEY"),
    ("session_token", "AWS_SESSION_TOKEN"),
)


class JobError(TierlogError):
    """A maintenance job cannot run (bad arguments, unreachable stores)."""


@dataclass(frozen=True)
class RemoteTier:
    """How tasks reach the remote tier: object store URI, MetaStore URI, key prefix."""

    object_store: str
    meta_store: str
    prefix: str = ""
    store_options: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def create(
        object_store: str, meta_store: str, prefix: str = "", **store_options: str
    ) -> RemoteTier:
        """S3 credentials not given explicitly come from the driver's environment (the
        executors' environment may not have them)."""
        options = dict(store_options)
        if object_store.startswith("s3://"):
            for name, var in _S3_CREDENTIALS:
                if name not in options and os.environ.get(var):
                    options[name] = os.environ[var]
        return RemoteTier(object_store, meta_store, prefix, options)

    def open_store(self) -> ObjectStore:
        return open_object_store(self.object_store, **self.store_options)

    def open_meta(self) -> MetaStore:
        return open_meta_store(self.meta_store)

    @property
    def streams_root(self) -> str:
        """``{prefix}/stream/``: where every incarnation's objects live."""
        base = self.prefix.strip("/")
        return f"{base}/stream/" if base else "stream/"


def add_tier_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` / ``--object-store`` / ``--meta-store`` / ``--prefix`` / ``--master``."""
    parser.add_argument("--config", help="server TOML config: take the stores from [storage]")
    parser.add_argument("--object-store", help="object store URI (file:///... or s3://...)")
    parser.add_argument("--meta-store", help="MetaStore URI (sqlite:///... or etcd://...)")
    parser.add_argument("--prefix", default="", help="key prefix of the streams in the store")
    parser.add_argument("--master", default="local[*]", help="Spark master (local[*])")


def tier_from_args(args: argparse.Namespace) -> RemoteTier:
    object_store, meta_store = args.object_store, args.meta_store
    if not (object_store and meta_store):
        from tierlog.server.config import load_config

        storage = load_config(args.config).storage.resolved()
        object_store = object_store or storage.object_store
        meta_store = meta_store or storage.meta_store
    return RemoteTier.create(object_store, meta_store, args.prefix)


def spark_session(app_name: str, master: str) -> Any:
    """A SparkSession for a job run from the command line, with the console progress bar.

    Python workers run this interpreter (so they import the same tierlog) unless
    ``PYSPARK_PYTHON`` says otherwise.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.ui.showConsoleProgress", "true")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    return session


class Progress:
    """One line per job stage on stderr (Spark's bar shows the tasks of each stage)."""

    def __init__(self, job: str, out: IO[str] | None = None) -> None:
        self.job = job
        self.out = out if out is not None else sys.stderr
        self.started = time.monotonic()
        self.stage = 0

    def __call__(self, message: str) -> None:
        self.stage += 1
        elapsed = time.monotonic() - self.started
        print(
            f"[tierlog {self.job}] stage {self.stage} ({elapsed:.1f}s): {message}",
            file=self.out,
            flush=True,
        )


def run_distributed(spark: Any, items: list[Any], func: Any, description: str) -> list[Any]:
    """``func`` over ``items``, one Spark task per item; results in item order."""
    if not items:
        return []
    sc = spark.sparkContext
    sc.setJobDescription(description)
    try:
        return list(sc.parallelize(items, len(items)).map(func).collect())
    finally:
        sc.setJobDescription(None)


def select_streams(
    catalog: Catalog, names: list[str] | None, vhost: str = "/"
) -> list[StreamRecord]:
    """Live streams (all, or the named ones of ``vhost``), sorted by vhost and name."""
    if names:
        return [catalog.require(vhost, n) for n in names]
    return sorted(catalog.list(), key=lambda r: (r.vhost, r.name))


def write_json(report: dict[str, Any], path: str | None) -> None:
    """The report on stdout, and to ``path`` when given."""
    text = json.dumps(report, indent=2, sort_keys=True)
    print(text, flush=True)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")


# ------------------------------------------------------------------------- manifests


@dataclass
class ManifestWalk:
    """Everything reachable from one committed root, and what was wrong on the way."""

    pointer: ManifestPointer | None
    root_key: str | None = None
    first_offset: int = 0
    next_offset: int = 0
    branch_keys: list[str] = field(default_factory=list)
    fragments: list[FragmentEntry] = field(default_factory=list)
    problems: list[dict[str, str]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when the whole tree was read without a problem."""
        return not self.problems

    def referenced(self) -> set[str]:
        out = {key for f in self.fragments for key in f.object_keys}  # segments: data + index
        out.update(self.branch_keys)
        if self.root_key:
            out.add(self.root_key)
        return out


def walk_manifest(
    store: ObjectStore, catalog: Catalog, prefix: str, incarnation: str, attempts: int = 5
) -> ManifestWalk:
    """Read the committed root of ``incarnation`` and every branch below it with the remote
    tier's tolerant walker (each node checked against the entry naming it). A root that
    vanished (superseded and deleted between reading the pointer and the root) makes it
    re-read the pointer."""
    try:
        pointer, data = read_committed_root(catalog, store, prefix, incarnation, attempts)
    except TransientError:
        walk = ManifestWalk(catalog.read_pointer(incarnation))
        walk.problems.append(_problem("missing-root", incarnation, "the committed root is missing"))
        return walk
    walk = ManifestWalk(pointer)
    if pointer is None or pointer.root_uid is None or data is None:
        return walk
    walk.root_key = keys.root_key(prefix, incarnation, bytes.fromhex(pointer.root_uid))
    try:
        root = decode_node(data)
    except FormatError as exc:
        walk.problems.append(_problem("corrupt-root", walk.root_key, str(exc)))
        return walk
    h = root.header
    if h.kind != KIND_ROOT or h.stream_dir != incarnation:
        detail = f"kind {h.kind}, stream {h.stream_dir!r}"
        walk.problems.append(_problem("bad-root", walk.root_key, detail))
        return walk
    walk.first_offset, walk.next_offset = h.first_offset, h.next_offset
    walker = ManifestWalker(prefix, incarnation, store.get, tolerant=True)
    walk.fragments = list(walker.walk(root.entries, h.next_offset))
    walk.branch_keys = walker.branch_keys
    walk.problems += [p.to_dict() for p in walker.problems]
    return walk


def _problem(kind: str, key: str, detail: str) -> dict[str, str]:
    return {"kind": kind, "key": key, "detail": detail}


def chunked(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
