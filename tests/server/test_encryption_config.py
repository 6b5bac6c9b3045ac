"""The server config's ``[encryption]`` table: keys inline or from files, which is current,
validated at start-up with clear errors (exit code 2), the environment overriding it, and the
keys really used (a stream created with encryption through a server configured only by the
table writes sealed objects under the current key)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tierlog.errors import ConfigError
from tierlog.formats.encryption import key_block_kek_id
from tierlog.remote.encryption import process_keyring, reset_process_keyring
from tierlog.remote.sealing import is_sealed, key_block_of
from tierlog.server.config import EncryptionSection, load_config

K1 = bytes(range(32))
K2 = bytes(range(100, 132))
B1 = base64.b64encode(K1).decode()
B2 = base64.b64encode(K2).decode()


@pytest.fixture(autouse=True)
def clean_keyring(monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.delenv("TIERLOG_KEKS", raising=False)
    monkeypatch.delenv("TIERLOG_KEK_FILE", raising=False)
    reset_process_keyring()
    yield None
    reset_process_keyring()


def test_keys_inline_and_from_files(tmp_path: Path) -> None:
    raw = tmp_path / "k2.raw"
    raw.write_bytes(K2)
    text = tmp_path / "k3.b64"
    text.write_text(base64.b64encode(K1[::-1]).decode() + "\n")
    path = tmp_path / "c.toml"
    path.write_text(
        f'[encryption]\ncurrent = "k2"\n'
        f'keys = {{ k1 = "base64:{B1}", k2 = "{raw}", k3 = "{text}" }}\n'
    )
    ring = load_config(str(path), environ={}).encryption.keyring()
    assert ring is not None
    assert ring.current_id == "k2"
    assert dict(ring.keys) == {"k1": K1, "k2": K2, "k3": K1[::-1]}
    one = EncryptionSection(keys={"only": f"base64:{B1}"}).keyring()
    assert one is not None and one.current_id == "only"  # current optional with one key
    env = {"TIERLOG_ENCRYPTION_KEYS": f"e1:base64:{B2}", "TIERLOG_ENCRYPTION_CURRENT": "e1"}
    ring = load_config(None, environ=env).encryption.keyring()
    assert ring is not None and ring.current_id == "e1" and ring.keys["e1"] == K2


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (f'current = "k9"\nkeys = {{ k1 = "base64:{B1}" }}', "'k9' is not one of"),
        (f'keys = {{ k1 = "base64:{B1}", k2 = "base64:{B2}" }}', "current must name"),
        ('keys = { k1 = "base64:AAAA" }', "3 bytes, AES-256 needs 32"),
        ('keys = { k1 = "base64:not base64!" }', "not base64"),
        ('keys = { k1 = "/no/such/key/file" }', "cannot read key file"),
        (f'keys = {{ "bad id" = "base64:{B1}" }}', "must be 1-64"),
        ('current = "k1"', "encryption.keys is empty"),
        ("keys = 5", "must be a table"),
        ("nope = 1", "unknown setting encryption.nope"),
    ],
)
def test_bad_tables_are_config_errors(tmp_path: Path, table: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[encryption]\n" + table + "\n")
    with pytest.raises(ConfigError, match=message):
        load_config(str(path), environ={})


def test_a_bad_key_file_stops_the_server_with_exit_code_2(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[encryption]\nkeys = { k1 = "base64:AAAA" }\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERLOG_")}
    done = subprocess.run(
        [sys.executable, "-m", "tierlog", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "PYTHONPATH": "src"},
    )
    assert done.returncode == 2
    assert "encryption.keys.k1 is 3 bytes" in done.stderr


async def test_the_table_is_the_servers_keyring_and_the_environment_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rstream import Producer

    from tests.server.test_tiering import STREAM_ARGS, config, status, wait_for
    from tierlog.server.app import Server
    from tierlog.storage.object_store import open_object_store

    cfg = config(tmp_path)
    table = EncryptionSection(keys={"old": f"base64:{B1}", "new": f"base64:{B2}"}, current="new")
    cfg = replace(cfg, encryption=table).validate()
    server = Server(cfg)
    ring = process_keyring()
    assert ring is not None and ring.current_id == "new"
    await server.start()
    try:
        async with Producer(
            "127.0.0.1", port=server.stream_port, username="guest", password="guest"
        ) as producer:
            await producer.create_stream(
                "enc", arguments={**STREAM_ARGS, "x-tierlog-encryption": "true"}
            )
            await producer.send_batch("enc", [b"secret-%d" % i for i in range(500)])

        async def tiered() -> bool:
            return bool((await status(server, "enc"))["remote"]["tiered_offset"] == 500)

        await wait_for(tiered, 60)
        store = open_object_store(cfg.storage.resolved().object_store)
        written = [m.key for m in store.list() if m.key.endswith((".fragment", ".manifest"))]
        assert any(k.endswith(".manifest") for k in written)
        for key in written:
            data = store.get(key)
            assert b"secret-1" not in data
            if key.endswith(".manifest"):
                assert is_sealed(data)
                assert key_block_kek_id(key_block_of(data)) == "new"
    finally:
        await server.stop()
    monkeypatch.setenv("TIERLOG_KEKS", f"env1:{B1}")
    Server(cfg)  # the environment wins over the table
    ring = process_keyring()
    assert ring is not None and ring.current_id == "env1"
