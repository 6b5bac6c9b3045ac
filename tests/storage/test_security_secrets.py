"""S3 credentials from a locked-down file; the secret never shows in logs, metrics,
admin responses or error messages (checked by grepping every output)."""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from pathlib import Path

import pytest

from tests.plugins.seaweed import SeaweedServer
from tests.plugins.tierlog_server import RawClient, TierlogServerProcess
from tierlog.errors import ConfigError
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish
from tierlog.storage.credentials import load_credentials_file
from tierlog.storage.s3_config import S3Config

GUEST = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}


def _credentials(path: Path, access: str, secret: str, mode: int = 0o600) -> Path:
    path.write_text(f'access_key_id = "{access}"\nsecret_access_key = "{secret}"\n')
    path.chmod(mode)
    return path


def test_credentials_file_must_be_private(tmp_path: Path) -> None:
    secret = "very-secret-value-123"
    path = _credentials(tmp_path / "s3.toml", "AKID", secret, 0o644)
    with pytest.raises(ConfigError, match="chmod 600") as info:
        load_credentials_file(str(path))
    assert secret not in str(info.value)
    path.chmod(0o640)
    with pytest.raises(ConfigError, match="group or others"):
        load_credentials_file(str(path))
    path.chmod(0o600)
    config = S3Config.from_uri(f"s3://bucket-x/p?credentials_file={path}", env={})
    assert config.access_key_id == "AKID" and config.secret_access_key == secret
    assert secret not in repr(config)
    # a malformed file: the parse error would quote the line; we only say where
    path.write_text(f'secret_access_key = "{secret}\n')
    with pytest.raises(ConfigError) as info:
        load_credentials_file(str(path))
    assert secret not in str(info.value)
    with pytest.raises(ConfigError, match="cannot open"):
        S3Config.from_uri("s3://bucket-x", env={"TIERLOG_S3_CREDENTIALS_FILE": "/nope"})


def _get(url: str) -> str:
    request = urllib.request.Request(url, headers=GUEST)
    with urllib.request.urlopen(request, timeout=10) as r:
        return r.read().decode()


@pytest.mark.s3
def test_secret_never_in_outputs(tmp_path: Path, seaweed: SeaweedServer) -> None:
    creds = _credentials(tmp_path / "s3.toml", seaweed.access_key, seaweed.secret_key)
    uri = (
        f"s3://{seaweed.bucket}/secrets-test?endpoint={seaweed.endpoint}"
        f"&region={seaweed.region}&credentials_file={creds}"
    )
    config = f'[storage]\nobject_store = "{uri}"\n[server]\nlog_level = "DEBUG"\n'
    server = TierlogServerProcess(tmp_path / "data", config_text=config).start()
    outputs: list[str] = []
    try:
        client = RawClient(server.host, server.stream_port)
        assert client.handshake() == 1
        client.send(c.CreateRequest(client.next_corr(), "s", {}).encode())
        client.expect(c.SimpleResponse)
        client.send(c.DeclarePublisherRequest(client.next_corr(), 1, "", "s").encode())
        client.expect(c.SimpleResponse)
        client.send(encode_publish(1, [(i, b"x" * 100) for i in range(1, 101)]))
        client.expect(PublishConfirm)
        client.close()
        time.sleep(1.0)
        for path in ("/metrics", "/api/streams", "/api/streams/s", "/api/health"):
            outputs.append(_get(server.admin_url + path))
        outputs.append(json.dumps(json.loads(outputs[1])))
    finally:
        server.stop()
    outputs.append(server.log_tail(10_000_000))
    # a server started with a world-readable file refuses to start, without the secret
    creds.chmod(0o644)
    refused = TierlogServerProcess(tmp_path / "data2", config_text=config)
    with pytest.raises(RuntimeError) as info:
        refused.start()
    outputs.append(str(info.value))
    assert "chmod 600" in str(info.value)
    for text in outputs:
        assert seaweed.secret_key not in text
