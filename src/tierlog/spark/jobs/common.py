"""What every Spark maintenance job shares: where the remote tier is, the Spark session,
progress lines, and (from ``remote/manifest_check.py``, re-exported) a checked walk of a
stream's manifest tree.

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

from tierlog.errors import ConfigError
from tierlog.remote import keys
from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.remote.manifest_check import ManifestWalk as ManifestWalk  # re-exported
from tierlog.remote.manifest_check import walk_manifest as walk_manifest
from tierlog.spark.errors import StoreMissingError
from tierlog.spark.stores import check_master, require_existing
from tierlog.storage.errors import NotFoundError
from tierlog.storage.meta_store import MetaStore, open_meta_store
from tierlog.storage.object_store import ObjectStore, open_object_store

_S3_CREDENTIALS = (
    ("access_key_id", "AWS_ACCESS_KEY_ID"),
    ("secret_access_key", "AWS_SECRET_ACCESS_KEY"),
    ("session_token", "AWS_SESSION_TOKEN"),
)


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
        """The object store (a missing ``file://`` directory is an error, never created)."""
        require_existing(self.object_store, "--object-store")
        return open_object_store(self.object_store, **self.store_options)

    def open_meta(self) -> MetaStore:
        """The MetaStore (a missing ``sqlite://`` file is an error, never created)."""
        require_existing(self.meta_store, "--meta-store")
        return open_meta_store(self.meta_store)

    @property
    def streams_root(self) -> str:
        """``{prefix}/stream/``: where every incarnation's objects live."""
        base = self.prefix.strip("/")
        return f"{base}/stream/" if base else "stream/"


def add_tier_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the remote tier is, and how to run Spark (``--master``, ``--conf k=v``)."""
    parser.add_argument("--config", help="server TOML config: take the stores from [storage]")
    parser.add_argument("--object-store", help="object store URI (file:///... or s3://...)")
    parser.add_argument("--meta-store", help="MetaStore URI (sqlite:///... or etcd://...)")
    parser.add_argument("--prefix", default="", help="key prefix of the streams in the store")
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master (default: what spark-submit / spark-defaults.conf set, else local[*])",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting (repeatable), as spark-submit's --conf",
    )
    parser.add_argument(
        "--shared-paths",
        action="store_true",
        help="file:// / sqlite:// paths are mounted at the same place on every Spark node "
        "(otherwise they are refused with a non-local master)",
    )


def tier_from_args(args: argparse.Namespace) -> RemoteTier:
    object_store, meta_store = args.object_store, args.meta_store
    if not (object_store and meta_store):
        from tierlog.server.config import load_config

        storage = load_config(args.config).storage.resolved()
        object_store = object_store or storage.object_store
        meta_store = meta_store or storage.meta_store
    return RemoteTier.create(object_store, meta_store, args.prefix)


DEFAULT_MASTER = "local[*]"


def parse_conf(pairs: list[str] | None) -> dict[str, str]:
    """``--conf KEY=VALUE`` arguments as a dict (later ones win, as with spark-submit)."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--conf {pair!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out


def configured_settings() -> dict[str, str]:
    """What spark-submit / ``pyspark`` / ``spark-defaults.conf`` configured.

    Starting the gateway (or joining spark-submit's) loads those into the JVM's system
    properties, which a fresh ``SparkConf`` reads.
    """
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


def resolve_master(master: str | None, conf: dict[str, str]) -> str:
    """The master a job runs on: ``--master``, else ``spark.master`` from ``--conf``, else
    what spark-submit or ``spark-defaults.conf`` set (spark-submit's own default is
    ``local[*]``)."""
    if master is not None:
        return master
    if "spark.master" in conf:
        return conf["spark.master"]
    return configured_settings().get("spark.master", DEFAULT_MASTER)


def spark_session(app_name: str, master: str, conf: dict[str, str] | None = None) -> Any:
    """A SparkSession on ``master`` (see ``resolve_master``) with ``conf`` on top of what
    spark-submit configured, and the console progress bar. Python workers run this
    interpreter (so they import the same tierlog) unless ``PYSPARK_PYTHON`` or a
    configured ``spark.pyspark.python`` say otherwise.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    configured = configured_settings()
    settings = dict(conf or {})
    settings["spark.master"] = master
    if "spark.pyspark.python" not in configured:
        settings.setdefault("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
    builder = SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "true")
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def check_tier(tier: RemoteTier, streams: list[str] | None = None, vhost: str = "/") -> None:
    """Before a job runs: the MetaStore holds streams (the named ones, if any) and the
    object store holds the manifest root each committed stream's pointer names.

    A mistyped MetaStore URI or prefix would otherwise look like a healthy, empty remote
    tier (scrub ``ok``, gc deleting every object as an orphan), and a mistyped object
    store like a tier whose every fragment is missing.
    """
    with tier.open_meta() as meta, tier.open_store() as store:
        catalog = Catalog(meta)
        records = select_streams(catalog, streams, vhost)
        if not records:
            raise StoreMissingError(
                f"the MetaStore {tier.meta_store!r} holds no streams: wrong --meta-store?"
            )
        for record in records:
            pointer = catalog.read_pointer(record.incarnation)
            if pointer is None or pointer.root_uid is None:
                continue
            key = keys.root_key(tier.prefix, record.incarnation, bytes.fromhex(pointer.root_uid))
            try:
                store.head(key)
            except NotFoundError:
                raise StoreMissingError(
                    f"the object store {tier.object_store!r} has no committed manifest root "
                    f"{key!r} of stream {record.vhost}/{record.name}: wrong --object-store "
                    "or --prefix?"
                ) from None
            return  # one committed stream found where the catalog says: the pair matches


def check_cluster(master: str, tier: RemoteTier, shared_paths: bool) -> None:
    """Refuse host-local stores when ``master`` may put executors on other hosts."""
    uris = {"--object-store": tier.object_store, "--meta-store": tier.meta_store}
    check_master(master, uris, shared_paths)


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


def chunked(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
