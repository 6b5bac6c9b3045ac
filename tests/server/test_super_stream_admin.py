"""Super streams through the admin API and the ``tierlog super-stream`` command line:
create (by count and by binding keys), list, show, delete; the errors a client gets."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

from tests.plugins.tierlog_server import (  # noqa: F401
    RawClient,
    TierlogServerProcess,
    session_tierlog_server,
)
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode as R

HOST = "127.0.0.1"


def admin(
    server: TierlogServerProcess, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
        "Content-Type": "application/json",
    }
    request = urllib.request.Request(server.admin_url + path, data, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def cli(server: TierlogServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tierlog", "super-stream", *args, "--admin", server.admin_url]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=dict(os.environ))


def test_admin_api_creates_lists_shows_and_deletes(
    session_tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    server = session_tierlog_server
    status, made = admin(server, "POST", "/api/super-streams", {"name": "adm", "partitions": 2})
    assert status == 201, made
    assert (made["partitions"], made["binding_keys"]) == (["adm-0", "adm-1"], ["0", "1"])
    assert made["state"] == "ready"
    again = admin(server, "POST", "/api/super-streams", {"name": "adm", "partitions": 2})
    assert again[0] == 409
    by_keys = {"name": "adm-k", "binding_keys": ["eu", "us"], "arguments": {"max-age": "1h"}}
    status, made = admin(server, "POST", "/api/super-streams", by_keys)
    assert status == 201, made
    assert (made["partitions"], made["arguments"]) == (["adm-k-eu", "adm-k-us"], {"max-age": "1h"})
    for bad in (
        {"name": "adm-x"},
        {"name": "adm-x", "partitions": 0},
        {"name": "adm-x", "partitions": 2, "binding_keys": ["a", "b"]},
        {"name": "adm-x", "partitions": ["adm-x-0"], "binding_keys": ["a", "b"]},
        {"name": "adm-x", "partitions": 1, "arguments": {"no-such-argument": "1"}},
    ):
        status, answer = admin(server, "POST", "/api/super-streams", bad)
        assert status == 400, (bad, answer)
    assert admin(server, "GET", "/api/super-streams/adm-x")[0] == 404
    names = {s["name"] for s in admin(server, "GET", "/api/super-streams")[1]["super_streams"]}
    assert {"adm", "adm-k"} <= names and "adm-x" not in names
    assert admin(server, "GET", "/api/streams/adm-k-us")[0] == 200  # an ordinary stream
    assert admin(server, "GET", "/api/super-streams/adm")[1]["partitions"] == ["adm-0", "adm-1"]
    status, gone = admin(server, "DELETE", "/api/super-streams/adm")
    assert (status, gone) == (200, {"deleted": "adm", "partitions": ["adm-0", "adm-1"]})
    assert admin(server, "GET", "/api/streams/adm-0")[0] == 404
    assert admin(server, "DELETE", "/api/super-streams/adm")[0] == 404
    assert admin(server, "DELETE", "/api/super-streams/adm-k")[0] == 200


def test_command_line_creates_lists_shows_and_deletes(
    session_tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    server = session_tierlog_server
    made = cli(server, "create", "cli-ss", "--binding-keys", "a,b", "--argument", "max-age=2h")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["partitions"] == ["cli-ss-a", "cli-ss-b"]
    listed = [json.loads(line) for line in cli(server, "list").stdout.splitlines()]
    assert "cli-ss" in {r["name"] for r in listed}
    shown = json.loads(cli(server, "show", "cli-ss").stdout)
    assert (shown["binding_keys"], shown["arguments"]) == (["a", "b"], {"max-age": "2h"})
    raw = RawClient(HOST, server.stream_port, timeout=10)  # what clients route by
    try:
        assert raw.handshake() == R.OK
        raw.send(c.RouteRequest(raw.next_corr(), "b", "cli-ss").encode())
        answer = raw.expect(c.RouteResponse)
        assert isinstance(answer, c.RouteResponse)
        assert (answer.response_code, list(answer.streams)) == (R.OK, ["cli-ss-b"])
    finally:
        raw.close()
    duplicate = cli(server, "create", "cli-ss", "--partitions", "2")
    assert duplicate.returncode == 1 and "409" in duplicate.stderr
    assert cli(server, "delete", "cli-ss").returncode == 0
    missing = cli(server, "show", "cli-ss")
    assert missing.returncode == 1 and "404" in missing.stderr
    bad = cli(server, "create", "cli-bad", "--partitions", "1", "--argument", "novalue")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
