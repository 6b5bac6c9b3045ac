"""Cold-data benchmark: fragment format v2 on generated JSON-like events.

Generator (seeded, ``--seed``): events of a click-stream schema with repeated field names
and skewed values -- event type (page_view 60 %, click 30 %, purchase 10 %), a Pareto-
distributed user id, a random 48-bit session id, a page from a small set, a country (US
half the time), a user agent from three, an amount, and a free-text note of 0-400 random
lowercase words for size spread -- 100 to 600 bytes each. Chunks are built as the server
writes them: simple entries, ``--records-per-chunk`` records per chunk (one publish batch).
Fragments hold ``--fragment-mib`` of chunks.

Measured, on one core, in memory (no object store), per chunk frame:

* ``zstd_ratio``: chunk bytes / stored frame bytes, zstd level ``--level`` without dictionary;
* ``dict_ratio``: the same with a dictionary trained on the first fragment's chunks (as the
  tierer does);
* compress and decompress MB/s of chunk bytes (decompress includes every check a reader
  makes: frame CRC, chunk header against the index, bloom, data CRC);
* ``read_ratio``: catch-up read MB/s (chunk bytes) of a stream tiered as v2 (zstd with its
  trained dictionary) over the same stream tiered as v1, both read from the first offset
  through the cross-tier reader after the local segments were freed, from the filesystem
  object store (``--catch-up-mib`` of the data; 0 skips it and reports the in-memory CPU
  ratio: v2 decode + checks / v1 CRC checks). A local filesystem store costs nothing per byte,
  so this is the worst case for v2; over a network the 3-5x fewer bytes count for it.

* ``lookup_gets``: the key index built over the catch-up stream (4 windows, the session id as
  the key), GETs per key per window for 20 keys, records included.

Last line: ``zstd_ratio=<x> dict_ratio=<y> dict_gain=<y/x> read_ratio=<z> lookup_gets=<g>``.
Usage: ``python benches/cold.py --mib 64`` (``--mib 1024`` for the full 1 GiB run).
"""

from __future__ import annotations

import argparse
import random
import string
import time

from tierlog.formats.chunk import check_crc, decode_header, encode_chunk, encode_records
from tierlog.formats.fragment import FragmentChunkInfo, FragmentPlacement
from tierlog.formats.fragment_frames import (
    FrameDecoder,
)
from tierlog.formats.fragment_v2 import (
    CODEC_ZSTD,
    FrameCoding,
    decode_fragment,
    encode_fragment_v2,
    stored_sizes,
)
from tierlog.formats.zstd_dictionary import train_dictionary

PAGES = ["/", "/home", "/cart", "/checkout", "/search", "/product/{}", "/category/{}"]
AGENTS = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 Chrome/120.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 Mobile",
    "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0",
]
WORDS = ["".join(random.Random(i).choices(string.ascii_lowercase, k=3 + i % 7)) for i in range(500)]


def event(rng: random.Random, ts: int) -> bytes:
    kind = rng.choices(["page_view", "click", "purchase"], [6, 3, 1])[0]
    page = rng.choice(PAGES).format(rng.randrange(1000))
    note = " ".join(rng.choices(WORDS, k=int(rng.betavariate(1.2, 4) * 60)))
    body = (
        f'{{"event":"{kind}","ts":{ts},"user_id":{int(rng.paretovariate(1.1) * 100)},'
        f'"session_id":"{rng.getrandbits(48):012x}","page":"{page}",'
        f'"country":"{rng.choice(["US"] * 5 + ["DE", "FR", "JP", "BR", "IN"])}",'
        f'"agent":"{rng.choice(AGENTS)}","amount_cents":{rng.randrange(0, 50_000)},'
        f'"note":"{note}"}}'
    )
    return body.encode()[:600]


def chunks_of(
    rng: random.Random, total: int, per_chunk: int
) -> list[tuple[bytes, FragmentChunkInfo]]:
    out: list[tuple[bytes, FragmentChunkInfo]] = []
    offset, size, ts = 0, 0, 1_700_000_000_000
    while size < total:
        records = [event(rng, ts + i) for i in range(per_chunk)]
        chunk = encode_chunk(0, offset, 1, ts, [encode_records(records)])
        h = decode_header(chunk)
        info = FragmentChunkInfo(
            offset, ts, 1, len(chunk), h.num_records, h.data_crc, 0, h.num_entries
        )
        out.append((chunk, info))
        offset += h.num_records
        size += len(chunk)
        ts += 5
    return out


def fragments_of(
    chunks: list[tuple[bytes, FragmentChunkInfo]], fragment_bytes: int
) -> list[list[tuple[bytes, FragmentChunkInfo]]]:
    out: list[list[tuple[bytes, FragmentChunkInfo]]] = [[]]
    size = 0
    for c in chunks:
        if size + len(c[0]) > fragment_bytes and out[-1]:
            out.append([])
            size = 0
        out[-1].append(c)
        size += len(c[0])
    return out


def encode_all(
    fragments: list[list[tuple[bytes, FragmentChunkInfo]]], coding: FrameCoding
) -> tuple[list[bytes], float]:
    start = time.perf_counter()
    out = []
    for frag in fragments:
        parts, _ = encode_fragment_v2(
            FragmentPlacement(0, 0, 0), [c for c, _ in frag], [i for _, i in frag], coding
        )
        out.append(b"".join(parts))
    return out, time.perf_counter() - start


def decode_all(objects: list[bytes], dictionary: bytes | None) -> float:
    start = time.perf_counter()
    for data in objects:
        index = decode_fragment(data)
        decoder = FrameDecoder(index, dictionary=dictionary)  # type: ignore[arg-type]
        positions = index.records["position"].astype(int).tolist()
        sizes = stored_sizes(index).astype(int).tolist()
        view = memoryview(data)
        for i, (p, s) in enumerate(zip(positions, sizes, strict=True)):
            decoder.decode(i, view[p : p + s])
    return time.perf_counter() - start


def plain_read(chunks: list[tuple[bytes, FragmentChunkInfo]]) -> float:
    start = time.perf_counter()
    for chunk, _ in chunks:
        h = decode_header(chunk)
        check_crc(h, memoryview(chunk)[h.data_start : h.data_start + h.data_length])
    return time.perf_counter() - start


def catch_up_mb_per_s(
    chunks: list[tuple[bytes, FragmentChunkInfo]], root: str, coded: bool, level: int
) -> tuple[float, float]:
    """Tier ``chunks`` into a fresh stream and read them back from the remote tier."""
    import os

    from tierlog.log.config import LogConfig
    from tierlog.log.offset_spec import OffsetSpec
    from tierlog.log.writer import StreamLog
    from tierlog.read.manifest_source import ManifestSource
    from tierlog.read.prefetch import Prefetcher
    from tierlog.read.strategies import ReadStrategy
    from tierlog.read.tiered_reader import TieredReader
    from tierlog.remote.catalog import Catalog
    from tierlog.remote.settings import StreamSettings
    from tierlog.storage.fs_object_store import FsObjectStore
    from tierlog.storage.sqlite_meta_store import SqliteMetaStore
    from tierlog.tiering.deletion import DeletionQueue
    from tierlog.tiering.state import TieringConfig
    from tierlog.tiering.tierer import StreamTierer

    os.makedirs(root)
    meta = SqliteMetaStore(os.path.join(root, "meta.db"))
    catalog = Catalog(meta)
    record = catalog.create("/", "bench")
    log = StreamLog.create(os.path.join(root, "data"), "/", "bench",
                           LogConfig(max_segment_bytes=8 << 20, fsync="never"),
                           created_ns=record.created_ns)  # fmt: skip
    settings = StreamSettings(compression="zstd", dictionary=True, compression_level=level)
    tierer = StreamTierer(
        log,
        FsObjectStore(os.path.join(root, "objects")),
        catalog,
        DeletionQueue(meta, grace_seconds=0.0),
        config=TieringConfig(fragment_bytes=4 << 20, max_fragment_age=0.2),
        settings=(lambda: settings) if coded else None,
    )
    tierer.start()
    wanted: list[bytes] = []
    for chunk, _ in chunks:  # the same records, re-chunked by the log as it appends them
        h = decode_header(chunk)
        data = memoryview(chunk)[h.data_start : h.data_start + h.data_length]
        from tierlog.formats.chunk import iter_records

        records = [bytes(r) for _, r in iter_records(h.chunk_id, data, h.num_entries)]
        if len(wanted) < 20 and h.chunk_id % 97 == 0:
            wanted.append(_session_key(memoryview(records[0])) or b"")
        log.append(records)
    log.sync()
    assert tierer.flush(600)
    for first in tierer.deletable_segments():
        log.delete_segment(first)
    prefetcher = Prefetcher()
    start = time.perf_counter()
    total = 0
    with TieredReader(log, ManifestSource(tierer), OffsetSpec.first(),
                      strategy=ReadStrategy.FORCE, prefetcher=prefetcher) as reader:  # fmt: skip
        while (chunk_read := reader.read_chunk()) is not None:
            total += len(chunk_read.raw)
    elapsed = time.perf_counter() - start
    gets = _lookup_gets(tierer, wanted) if coded else 0.0
    tierer.stop(flush=False, timeout=5)
    log.close()
    prefetcher.close()
    meta.close()
    return total / 1e6 / elapsed, gets


def _session_key(record: memoryview) -> bytes | None:
    """The event's session id (the bench's record key)."""
    raw = bytes(record)
    at = raw.find(b'"session_id":"')
    return raw[at + 14 : at + 26] if at >= 0 else None


def _lookup_gets(tierer: object, keys: list[bytes]) -> float:
    """Build the key index (4 windows) and look up 20 session ids in every window: GETs per
    key per window, records included (the fragment index reads of v2 frames are cached per
    lookup, as a reader's index cache does)."""
    from tierlog.remote.key_index_files import build_window, list_index_files, lookup_records
    from tierlog.storage.fs_object_store import FsObjectStore

    remote = tierer.remote  # type: ignore[attr-defined]
    tree = tierer.committer.tree  # type: ignore[attr-defined]
    fragments = [loc.entry for loc in tree.iter_fragments(remote.load)]
    lo, hi = fragments[0].min_timestamp, fragments[-1].max_timestamp + 1
    step = max(1, (hi - lo) // 4 + 1)
    for w in range(lo, hi, step):
        build_window(remote.store, remote.prefix, remote.stream_dir, "bench", fragments,
                     w, w + step, _session_key)  # fmt: skip
    files = list_index_files(remote.store, remote.prefix, remote.stream_dir)

    class Counting(FsObjectStore):
        gets = 0

        def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
            Counting.gets += 1
            return super().get(key, start, end)

        def get_suffix(self, key: str, length: int) -> bytes:
            Counting.gets += 1
            return super().get_suffix(key, length)

    store = Counting(remote.store.root)
    cache: dict = {}
    for f in files:  # warm the fragment index cache (a reader keeps it)
        lookup_records(store, remote.prefix, remote.stream_dir, "bench", f, b"warm", _session_key,
                       cache)  # fmt: skip
    Counting.gets = 0
    found = 0
    for key in keys:
        for f in files:
            found += len(lookup_records(store, remote.prefix, remote.stream_dir, "bench", f, key,
                                        _session_key, cache))  # fmt: skip
    assert found >= len(keys), f"found {found} of {len(keys)} keys"
    return Counting.gets / (len(keys) * len(files))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="chunk bytes to generate")
    ap.add_argument("--fragment-mib", type=int, default=16)
    ap.add_argument("--records-per-chunk", type=int, default=200)
    ap.add_argument("--level", type=int, default=3)
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--catch-up-mib", type=int, default=16)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    chunks = chunks_of(rng, args.mib << 20, args.records_per_chunk)
    total = sum(len(c) for c, _ in chunks)
    fragments = fragments_of(chunks, args.fragment_mib << 20)
    mb = total / 1e6
    print(f"{len(chunks)} chunks, {total / 2**20:.1f} MiB, {len(fragments)} fragments")

    plain = encode_all(fragments, FrameCoding(codec=CODEC_ZSTD, level=args.level))
    objects, t_plain = plain
    zstd_stored = sum(len(o) for o in objects)
    t_dplain = decode_all(objects, None)

    t0 = time.perf_counter()
    dictionary = train_dictionary([c for c, _ in fragments[0]], 32 << 10, args.level)
    t_train = time.perf_counter() - t0
    coding = FrameCoding(CODEC_ZSTD, args.level, b"\x01" * 16, dictionary)
    dict_objects, t_dict = encode_all(fragments, coding)
    dict_stored = sum(len(o) for o in dict_objects)
    t_ddict = decode_all(dict_objects, dictionary)
    t_v1 = plain_read(chunks)

    zstd_ratio = total / zstd_stored
    dict_ratio = total / dict_stored
    print(f"zstd  level {args.level}: ratio {zstd_ratio:.2f}, compress {mb / t_plain:.0f} MB/s, "
          f"decompress+check {mb / t_dplain:.0f} MB/s")  # fmt: skip
    print(f"dict  ({len(dictionary)} B, trained in {t_train:.2f} s): ratio {dict_ratio:.2f}, "
          f"compress {mb / t_dict:.0f} MB/s, decompress+check {mb / t_ddict:.0f} MB/s")  # fmt: skip
    print(f"v1 read (CRC checks only): {mb / t_v1:.0f} MB/s")
    per_chunk = total / len(chunks)
    print(f"per chunk ({per_chunk / 1024:.1f} KiB): compress {t_dict / len(chunks) * 1e6:.0f} us, "
          f"decompress {t_ddict / len(chunks) * 1e6:.0f} us (dictionary)")  # fmt: skip
    read_ratio = t_v1 / t_ddict
    gets_text = "na"
    if args.catch_up_mib:
        import tempfile

        sample: list[tuple[bytes, FragmentChunkInfo]] = []
        size = 0
        for c in chunks:
            if size >= args.catch_up_mib << 20:
                break
            sample.append(c)
            size += len(c[0])
        with tempfile.TemporaryDirectory() as tmp:
            v1, _ = catch_up_mb_per_s(sample, f"{tmp}/v1", False, args.level)
            v2, lookup_gets = catch_up_mb_per_s(sample, f"{tmp}/v2", True, args.level)
            gets_text = f"{lookup_gets:.2f}"
        print(f"catch-up read from the fs store: v1 {v1:.0f} MB/s, v2 {v2:.0f} MB/s")
        read_ratio = v2 / v1
    print(
        f"zstd_ratio={zstd_ratio:.2f} dict_ratio={dict_ratio:.2f} "
        f"dict_gain={dict_ratio / zstd_ratio:.2f} read_ratio={read_ratio:.2f} "
        f"lookup_gets={gets_text}"
    )


if __name__ == "__main__":
    main()
