"""Key lookup at full scale on SeaweedFS with a cold cache (the long run of
tests/remote/test_key_index_scale.py): a stream of 10 M records (default) written as v1
fragments, indexed over about 55 windows, then seeded random keys looked up, each through a
fresh lookup, with every GET counted per window and per record.

    python scripts/key_index_scale.py [--records 10000000] [--windows 55] [--lookups 50]

Prints progress, then one line of figures (see tests/remote/key_index_scale.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from tests.plugins.seaweed import _open_s3, start_seaweed
from tests.remote.key_index_scale import run_scale

from tierlog.storage.sqlite_meta_store import SqliteMetaStore


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--windows", type=int, default=55)
    parser.add_argument("--per-chunk", type=int, default=1000)
    parser.add_argument("--per-fragment", type=int, default=20)
    parser.add_argument("--lookups", type=int, default=50)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="tierlog-scale-")
    server = start_seaweed(workdir)
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {text}", flush=True)

    try:
        store = _open_s3(server, "scale")
        meta = SqliteMetaStore(os.path.join(workdir, "meta.db"))
        try:
            result = run_scale(
                store,
                meta,
                "",
                records=args.records,
                windows=args.windows,
                per_chunk=args.per_chunk,
                per_fragment=args.per_fragment,
                lookups=args.lookups,
                say=say,
            )
        finally:
            meta.close()
            store.close()
        print(result.line())
        return 1 if result.misses else 0
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
