"""``tierlog super-stream ...``: super streams through any node's admin API.

* ``tierlog super-stream list`` — every super stream (JSON lines)
* ``tierlog super-stream create NAME (--partitions N | --binding-keys K1,K2,...)
  [--argument KEY=VALUE ...]`` — as RabbitMQ's ``rabbitmq-streams add_super_stream``:
  partitions ``NAME-0`` … bound with ``0`` …, or ``NAME-K1`` … bound with ``K1`` …
* ``tierlog super-stream show NAME`` — one super stream
* ``tierlog super-stream delete NAME`` — the super stream and its partitions

``--vhost`` (default ``/``); ``--admin``, ``--user``, ``--password`` as ``tierlog node``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any
from urllib.parse import quote, urlencode

from tierlog.errors import ConfigError
from tierlog.server.node_cli import DEFAULT_ADMIN_URL, admin_request


def add_super_stream_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    top = sub.add_parser("super-stream", help="list, create, show and delete super streams")
    commands = top.add_subparsers(dest="super_stream_command", required=True, metavar="ACTION")
    listing = commands.add_parser("list", help="every super stream (JSON lines)")
    listing.set_defaults(func=cmd_list)
    create = commands.add_parser("create", help="create a super stream and its partitions")
    create.add_argument("name")
    how = create.add_mutually_exclusive_group(required=True)
    how.add_argument("--partitions", type=int, help="N partitions NAME-0 … bound with 0 …")
    how.add_argument("--binding-keys", help="K1,K2,…: partitions NAME-K1 … bound with K1 …")
    create.add_argument(
        "--argument",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a stream argument of every partition (as in Create), repeatable",
    )
    create.set_defaults(func=cmd_create)
    show = commands.add_parser("show", help="one super stream")
    show.add_argument("name")
    show.set_defaults(func=cmd_show)
    delete = commands.add_parser("delete", help="delete a super stream and its partitions")
    delete.add_argument("name")
    delete.set_defaults(func=cmd_delete)
    for parser in (listing, create, show, delete):
        parser.add_argument("--vhost", default="/")
        parser.add_argument("--admin", default=DEFAULT_ADMIN_URL, help="any node's admin URL")
        parser.add_argument("--user", default=os.environ.get("TIERLOG_ADMIN_USER", "guest"))
        parser.add_argument("--password", default=os.environ.get("TIERLOG_ADMIN_PASSWORD", "guest"))


def _named(args: argparse.Namespace) -> str:
    return f"/api/super-streams/{quote(args.name, safe='')}?{urlencode({'vhost': args.vhost})}"


def cmd_list(args: argparse.Namespace) -> int:
    _, answer = admin_request(args, "GET", "/api/super-streams")
    for record in answer["super_streams"]:
        if record["vhost"] == args.vhost:
            _print(record)
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    arguments = {}
    for item in args.argument:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--argument {item!r}: expected KEY=VALUE")
        arguments[key] = value
    body: dict[str, Any] = {"name": args.name, "vhost": args.vhost, "arguments": arguments}
    if args.partitions is not None:
        body["partitions"] = args.partitions
    else:
        body["binding_keys"] = [k for k in args.binding_keys.split(",") if k]
    _, record = admin_request(args, "POST", "/api/super-streams", body)
    _print(record)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    _, record = admin_request(args, "GET", _named(args))
    _print(record)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    _, answer = admin_request(args, "DELETE", _named(args))
    _print(answer)
    return 0


def _print(value: Any) -> None:
    print(json.dumps(value, sort_keys=True))
