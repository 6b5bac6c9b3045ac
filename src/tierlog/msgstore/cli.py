"""``tierlog msgstore migrate DIR`` and ``tierlog msgstore dump DIR``."""

from __future__ import annotations

import argparse
import json
import os
import sys


def add_msgstore_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    msgstore = sub.add_parser(
        "msgstore", help="message store tools: migrate RabbitMQ v1 files, dump records"
    )
    commands = msgstore.add_subparsers(dest="msgstore_command", required=True, metavar="COMMAND")
    migrate = commands.add_parser(
        "migrate", help="convert every v1 .rdq file of a message store directory to v2 .sqs"
    )
    migrate.add_argument("path", help="a message store directory (e.g. msg_store_persistent)")
    migrate.set_defaults(func=cmd_migrate)
    dump = commands.add_parser(
        "dump", help="print every record of a message store directory as JSON lines (read-only)"
    )
    dump.add_argument("path", help="a message store directory (v1 .rdq and/or v2 .sqs files)")
    dump.set_defaults(func=cmd_dump)


def cmd_migrate(args: argparse.Namespace) -> int:
    from tierlog.msgstore.errors import NotADirectoryStoreError
    from tierlog.msgstore.migrate import migrate_v1
    from tierlog.msgstore.store import MessageStore

    if not os.path.isdir(args.path):
        raise NotADirectoryStoreError(f"{args.path} is not a message store directory")
    store = MessageStore.open(args.path)
    try:
        result = migrate_v1(store)
    except BaseException:
        store.abandon()
        raise
    store.close()
    print(
        json.dumps(
            {
                "v1_files": result.v1_files,
                "messages": result.messages,
                "bytes_written": result.bytes_written,
                "v1_liveness": "rabbitmq_index" if store.v1_liveness_known else "unknown",
            }
        )
    )
    return 0


def cmd_dump(args: argparse.Namespace) -> int:
    from tierlog.msgstore.dump import dump

    try:
        errors = dump(args.path, sys.stdout)
    except BrokenPipeError:
        return 0
    return 1 if errors else 0
