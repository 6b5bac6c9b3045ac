"""``tierlog recover-pointers``: a lost or corrupt manifest pointer is rebuilt from the root
objects in the store, and the stream reads back everything that was tiered."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.stream import build, read_all
from tierlog.cli import main
from tierlog.remote.catalog import pointer_key
from tierlog.storage.sqlite_meta_store import SqliteMetaStore


@pytest.mark.parametrize("damage", ["deleted", "garbage"])
def test_recover_pointers_rebuilds_the_pointer(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = build(str(tmp_path / "data"))
    meta = SqliteMetaStore(stream.meta_path)
    key = pointer_key(stream.incarnation)
    good = meta.get(key)
    assert good is not None
    if damage == "deleted":
        meta.delete(key)
    else:
        meta.put_if(key, b"\x00garbage", good.version, good.epoch)
    meta.close()
    config = tmp_path / "server.toml"
    config.write_text(
        f'[storage]\ndata_dir = "{stream.root}"\nmeta_store = "sqlite://{stream.meta_path}"\n'
        f'object_store = "file://{stream.objects}"\n'
    )
    assert main(["recover-pointers", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"{stream.incarnation}: recovered" in out
    meta = SqliteMetaStore(stream.meta_path)
    rebuilt = meta.get(key)
    meta.close()
    assert rebuilt is not None  # a root naming the same data (ties between equal roots)
    records, _ = read_all(stream)
    assert records == stream.confirmed
    assert main(["recover-pointers", "--config", str(config)]) == 0
    assert f"{stream.incarnation}: ok" in capsys.readouterr().out
    assert os.path.exists(stream.meta_path)
