"""``tierlog node ...``: cluster node operations through any node's admin API.

* ``tierlog node retire NAME [--wait]`` — start retiring ``NAME`` (its streams are
  handed over and re-replicated, then it releases its node lease); with ``--wait``,
  follow its progress until it has retired.
* ``tierlog node status [NAME]`` — one node's status (or every node's), as JSON.

``--admin URL`` names any node's admin listener (default ``http://127.0.0.1:15552``);
credentials come from ``--user`` / ``--password`` or ``TIERLOG_ADMIN_USER`` /
``TIERLOG_ADMIN_PASSWORD`` (default ``guest`` / ``guest``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from tierlog.server.errors import AdminRequestError

DEFAULT_ADMIN_URL = "http://127.0.0.1:15552"


def add_node_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    node = sub.add_parser("node", help="cluster node operations (retire, status)")
    commands = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    retire = commands.add_parser(
        "retire", help="retire a node: hand over its streams, replace it, release its lease"
    )
    retire.add_argument("name", help="the node's name (cluster.node)")
    retire.add_argument(
        "--wait", action="store_true", help="follow the retirement until it finished"
    )
    retire.add_argument(
        "--timeout", type=float, default=600.0, help="seconds --wait waits at most (600)"
    )
    retire.set_defaults(func=cmd_node_retire)
    status = commands.add_parser("status", help="a node's status (every node's without NAME)")
    status.add_argument("name", nargs="?", help="the node's name")
    status.set_defaults(func=cmd_node_status)
    for parser in (retire, status):
        parser.add_argument("--admin", default=DEFAULT_ADMIN_URL, help="any node's admin URL")
        parser.add_argument("--user", default=os.environ.get("TIERLOG_ADMIN_USER", "guest"))
        parser.add_argument("--password", default=os.environ.get("TIERLOG_ADMIN_PASSWORD", "guest"))


def admin_request(
    args: argparse.Namespace, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    """One admin API call; the status and the JSON answer. ``AdminRequestError`` when
    the node cannot be reached or answers with an error status."""
    credentials = base64.b64encode(f"{args.user}:{args.password}".encode()).decode()
    headers = {"Authorization": f"Basic {credentials}"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    url = args.admin.rstrip("/") + path
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except (ValueError, AttributeError):
            message = exc.reason
        raise AdminRequestError(f"{method} {url}: {exc.code} {message}", exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        raise AdminRequestError(f"{method} {url}: {exc}") from None


def cmd_node_retire(args: argparse.Namespace) -> int:
    path = f"/api/nodes/{quote(args.name, safe='')}"
    _, status = admin_request(args, "POST", path + "/retire", {})
    _print(status)
    if not args.wait:
        return 0
    deadline = time.monotonic() + args.timeout
    left = None
    while not status.get("retired"):
        if time.monotonic() > deadline:
            raise AdminRequestError(
                f"node {args.name} has not retired after {args.timeout:g} s"
                f" ({len(status.get('streams_left', []))} streams left)"
            )
        time.sleep(1.0)
        _, status = admin_request(args, "GET", path)
        streams = [s["stream"] for s in status.get("streams_left", [])]
        if streams != left:
            left = streams
            print(f"{args.name}: {len(streams)} streams left {streams}", file=sys.stderr)
    _print(status)
    return 0


def cmd_node_status(args: argparse.Namespace) -> int:
    path = "/api/nodes" + (f"/{quote(args.name, safe='')}" if args.name else "")
    _, status = admin_request(args, "GET", path)
    _print(status)
    return 0


def _print(value: Any) -> None:
    print(json.dumps(value, sort_keys=True))
