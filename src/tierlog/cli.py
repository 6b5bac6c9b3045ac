"""The ``tierlog`` command line: one argparse subcommand per job.

``dump`` prints a stream directory's records; ``quickstart`` runs the embedded
default (append a stream under ./tierlog-data and read it back). Later layers add
their own subcommands (``serve``, ``spark ...``) through ``build_parser``.

The usual mistakes end in one line on stderr and an exit code of their own, never a
traceback (the codes are listed in docs/server.md): a bad setting, a missing optional
dependency, a port in use, a store that cannot be reached.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import TextIO

import tierlog
from tierlog.errors import ConfigError, TierlogError

EXIT_OK = 0
EXIT_ERROR = 1
"""Any other error tierlog reports on purpose (the message says what)."""
EXIT_CONFIG = 2
"""Bad command line or configuration: an unknown setting or a value not allowed."""
EXIT_MISSING_EXTRA = 3
"""An optional dependency is not installed (the message names the pip extra)."""
EXIT_LISTEN = 4
"""A listening port could not be bound (in use, not permitted)."""
EXIT_STORE = 5
"""The data directory, object store or MetaStore could not be opened or reached."""
EXIT_INTERRUPTED = 130

EXTRAS = {
    "obstore": "s3",
    "boto3": "s3",
    "botocore": "s3",
    "aetcd": "etcd",
    "grpc": "etcd",
    "aiohttp": "server",
    "uvloop": "server",
    "rstream": "server",
    "pyspark": "spark",
    "pyarrow": "spark",
}
"""Top-level module -> the extra of pyproject.toml that installs it."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tierlog", description="A bottomless stream server.")
    parser.add_argument("--version", action="version", version=f"tierlog {tierlog.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    dump = sub.add_parser("dump", help="print every user record of a stream directory (JSON lines)")
    dump.add_argument("path", help="a stream directory (tierlog or RabbitMQ/Osiris)")
    dump.add_argument(
        "--object-store",
        help="also read the stream's remote tier (fragments or offloaded segments) from this "
        "store URI (file:///... or s3://...); needs --meta-store",
    )
    dump.add_argument("--meta-store", help="the metadata store URI holding the stream's catalog")
    dump.add_argument("--prefix", default="", help="key prefix of the remote tier (tier.prefix)")
    dump.set_defaults(func=cmd_dump)

    quick = sub.add_parser(
        "quickstart",
        help="start a server on embedded defaults, publish, tier, consume back from the "
        "remote tier (--local-only: just the local log)",
    )
    quick.add_argument(
        "--local-only", action="store_true", help="append and read the local log only"
    )
    quick.add_argument("--data-dir", default="tierlog-data", help="data directory (./tierlog-data)")
    quick.add_argument("--records", type=int, default=10_000, help="records to append")
    quick.add_argument("--batch", type=int, default=1_000, help="records per append (chunk)")
    quick.set_defaults(func=cmd_quickstart)
    add_serve_command(sub)
    add_lookup_command(sub)
    add_recover_pointers_command(sub)
    add_spark_commands(sub)
    from tierlog.msgstore.cli import add_msgstore_commands
    from tierlog.server.node_cli import add_node_commands
    from tierlog.server.super_stream_cli import add_super_stream_commands

    add_msgstore_commands(sub)
    add_node_commands(sub)
    add_super_stream_commands(sub)
    return parser


def add_lookup_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``tierlog lookup STREAM KEY``: a stream's records by key, through its key index."""
    lookup = sub.add_parser(
        "lookup", help="print a stream's records with a key (JSON lines), via its key index"
    )
    lookup.add_argument("stream", help="the stream's name")
    lookup.add_argument("key", help="the record key (AMQP message-id)")
    lookup.add_argument("--vhost", default="/", help="the stream's vhost (/)")
    lookup.add_argument("--from", dest="from_", help="oldest chunk time: ms or ISO-8601")
    lookup.add_argument("--to", help="newest chunk time: ms or ISO-8601")
    lookup.add_argument("--config", help="the server's TOML config (stores, prefix, keys)")
    lookup.add_argument("--object-store", help="object store URI (instead of --config)")
    lookup.add_argument("--meta-store", help="metadata store URI (with --object-store)")
    lookup.add_argument("--prefix", default="", help="key prefix of the remote tier")
    lookup.set_defaults(func=cmd_lookup)


def cmd_lookup(args: argparse.Namespace) -> int:
    import json

    from tierlog.remote.encryption import install_configured_keyring
    from tierlog.remote.key_lookup import lookup_key, parse_timestamp
    from tierlog.server.config import load_config
    from tierlog.storage.meta_store import open_meta_store
    from tierlog.storage.object_store import open_object_store

    if bool(args.object_store) != bool(args.meta_store):
        raise ConfigError("--object-store and --meta-store go together")
    if args.object_store and args.config:
        raise ConfigError("--config and --object-store are alternatives")
    lo = parse_timestamp(args.from_, "--from") if args.from_ else None
    hi = parse_timestamp(args.to, "--to") if args.to else None
    if args.object_store:
        object_store, meta_store, prefix = args.object_store, args.meta_store, args.prefix
        install_configured_keyring(None)
    else:
        config = load_config(args.config)
        storage = config.storage.resolved()
        object_store, meta_store = storage.object_store, storage.meta_store
        prefix = config.tier.prefix
        install_configured_keyring(config.encryption.keyring())
    with open_meta_store(meta_store) as meta, open_object_store(object_store) as store:
        found = lookup_key(
            meta,
            store,
            prefix,
            args.vhost,
            args.stream,
            args.key.encode(),
            from_timestamp=lo,
            to_timestamp=hi,
        )
    try:
        for item in found.to_json():
            sys.stdout.write(json.dumps(item, separators=(",", ":")) + "\n")
    except BrokenPipeError:
        return 0
    return 0


def add_recover_pointers_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``tierlog recover-pointers``: rebuild lost MetaStore pointers from stored roots."""
    recover = sub.add_parser(
        "recover-pointers",
        help="rebuild missing or corrupt manifest pointers in the MetaStore from the root "
        "objects in the object store (run with the server stopped)",
    )
    recover.add_argument("--config", help="the server's TOML config file")
    recover.add_argument("--dry-run", action="store_true", help="report, change nothing")
    recover.set_defaults(func=cmd_recover_pointers)


def cmd_recover_pointers(args: argparse.Namespace) -> int:
    from tierlog.remote.catalog import Catalog
    from tierlog.server.config import load_config
    from tierlog.storage.meta_store import open_meta_store
    from tierlog.storage.object_store import open_object_store
    from tierlog.tiering.pointer_recovery import recover_pointers

    config = load_config(args.config)
    storage = config.storage.resolved()
    meta = open_meta_store(storage.meta_store)
    store = open_object_store(storage.object_store)
    try:
        results = recover_pointers(Catalog(meta), store, config.tier.prefix, dry_run=args.dry_run)
    finally:
        store.close()
        meta.close()
    for r in results:
        where = f" root={r.root_uid} next_offset={r.next_offset}" if r.root_uid else ""
        print(f"{r.incarnation}: {r.status}{where}{' ' + r.detail if r.detail else ''}")
    return 1 if any(r.status == "failed" for r in results) else 0


def add_serve_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``tierlog serve [--config FILE]``: the stream server (see docs/server.md)."""
    serve = sub.add_parser("serve", help="run the stream server (RabbitMQ Stream protocol)")
    serve.add_argument("--config", help="TOML config file (TIERLOG_* variables override it)")
    serve.set_defaults(func=cmd_serve)


def add_spark_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``tierlog spark export|scrub|gc``: Spark jobs over the remote tier (docs/spark_jobs.md)."""
    from tierlog.spark.jobs.cli import add_job_parsers

    spark = sub.add_parser("spark", help="Spark jobs over the remote tier (export, scrub, gc)")
    add_job_parsers(spark.add_subparsers(dest="job", required=True, metavar="JOB"))


def cmd_serve(args: argparse.Namespace) -> int:
    from tierlog.server.app import serve
    from tierlog.server.config import load_config

    return serve(load_config(args.config), lambda: load_config(args.config))


def cmd_dump(args: argparse.Namespace) -> int:
    from tierlog.log.dump import dump

    if bool(args.object_store) != bool(args.meta_store):
        raise ConfigError("--object-store and --meta-store go together")
    try:
        if args.object_store:
            dump_tiered(args.path, args.object_store, args.meta_store, args.prefix, sys.stdout)
        else:
            dump(args.path, sys.stdout)
    except BrokenPipeError:
        return 0
    return 0


def dump_tiered(path: str, object_store: str, meta_store: str, prefix: str, out: TextIO) -> int:
    """``dump`` across both tiers: the remote tier (fragment or segment mode) below the local
    segments, the local ones above; the directory's name is the stream's incarnation."""
    from tierlog.log.dump import dump, dump_chunks
    from tierlog.log.offset_spec import OffsetSpec
    from tierlog.log.reader import LogView
    from tierlog.read.manifest_source import ManifestSource
    from tierlog.read.tiered_reader import TieredReader
    from tierlog.remote.catalog import Catalog
    from tierlog.remote.committed import CatalogCommittedManifest
    from tierlog.storage.meta_store import open_meta_store
    from tierlog.storage.object_store import open_object_store

    incarnation = os.path.basename(os.path.normpath(path))
    with open_meta_store(meta_store) as meta, open_object_store(object_store) as store:
        manifest = ManifestSource(
            CatalogCommittedManifest(Catalog(meta), store, prefix, incarnation)
        )
        with TieredReader(LogView(path), manifest, OffsetSpec.first()) as reader:
            return dump(path, out, dump_chunks(reader.chunks()))


def cmd_quickstart(args: argparse.Namespace) -> int:
    if not args.local_only:
        from tierlog.quickstart import main as server_quickstart

        if args.records < 1:
            print("error: --records must be positive", file=sys.stderr)
            return 2
        return server_quickstart(os.path.abspath(args.data_dir), args.records)
    return cmd_quickstart_local(args)


def cmd_quickstart_local(args: argparse.Namespace) -> int:
    from tierlog.log.config import LogConfig
    from tierlog.log.offset_spec import OffsetSpec
    from tierlog.log.writer import StreamLog

    if args.records < 1 or args.batch < 1:
        print("error: --records and --batch must be positive", file=sys.stderr)
        return 2
    data_dir = os.path.abspath(args.data_dir)
    existing = _find_stream(data_dir, "__quickstart_")
    if existing:
        log = StreamLog.open(existing, LogConfig())
        print(f"opened stream {existing} (next offset {log.next_offset})")
    else:
        log = StreamLog.create(data_dir, "/", "quickstart", LogConfig())
        print(f"created stream {log.stream_dir}")
    with log:
        start = log.next_offset
        t0 = time.perf_counter()
        done = 0
        while done < args.records:
            n = min(args.batch, args.records - done)
            log.append_records([b"quickstart record %d" % (start + done + i) for i in range(n)])
            done += n
        append_s = time.perf_counter() - t0
        print(
            f"appended {done} records in {done // args.batch + (done % args.batch > 0)} "
            f"chunks ({append_s:.3f} s, fsync per chunk); committed offset "
            f"{log.committed_offset}"
        )
        seen = log.query_offset("quickstart-reader")
        consumed = log.committed_offset
        log.store_offset("quickstart-reader", consumed)
        print(f"stored consumer offset {consumed} for 'quickstart-reader' (previous: {seen})")
        t0 = time.perf_counter()
        count = 0
        first = last = None
        with log.reader(OffsetSpec.offset(start)) as reader:
            for offset, record in reader.records():
                if first is None:
                    first = (offset, bytes(record))
                last = (offset, bytes(record))
                count += 1
        read_s = time.perf_counter() - t0
        print(f"read back {count} records from offset {start} in {read_s:.3f} s")
        if first and last:
            print(f"  first: {first[0]} {first[1]!r}")
            print(f"  last:  {last[0]} {last[1]!r}")
        segments = log.list_segments()
        print(
            f"stream has {len(segments)} segment(s), offsets {log.first_offset}.."
            f"{log.next_offset - 1} (tracking chunks take offsets too)"
        )
        print(f"inspect it with: tierlog dump {log.stream_dir}")
    return 0 if count == done else 1


def _find_stream(data_dir: str, prefix: str) -> str | None:
    if not os.path.isdir(data_dir):
        return None
    names = sorted(n for n in os.listdir(data_dir) if n.startswith(prefix))
    return os.path.join(data_dir, names[-1]) if names else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise  # not an optional dependency: a bug, keep the traceback
        return _fail(
            f"the {exc.name!r} package is missing: pip install 'tierlog[{extra}]'",
            EXIT_MISSING_EXTRA,
        )
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except TierlogError as exc:
        return _fail(str(exc), _exit_code(exc))


def _exit_code(exc: TierlogError) -> int:
    from tierlog.server.errors import ListenError, StoreUnavailableError

    if isinstance(exc, ConfigError):
        return EXIT_CONFIG
    if isinstance(exc, ListenError):
        return EXIT_LISTEN
    if isinstance(exc, StoreUnavailableError):
        return EXIT_STORE
    return EXIT_ERROR


def _fail(message: str, code: int) -> int:
    """One line on stderr, whatever the message holds."""
    print("error: " + " ".join(message.split()), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
