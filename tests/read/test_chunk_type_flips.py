"""A flipped chunk type byte (outside the data CRC) in either tier: a user chunk must never
pass as a tracking chunk, which readers skip. Remote: the fragment index carries each
chunk's type and the cursor checks the chunk's header against it. Tiering: a local chunk
whose type says tracking is uploaded only when it parses as one. Local: a reader that
meets it refuses, and the cross-tier reader serves the chunk's healthy remote copy."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.read.test_tiered import Stream, local_records, stream, tiered_records
from tierlog.formats.chunk import CHUNK_TYPE_POS, ChunkType
from tierlog.log.errors import CorruptChunkError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.read.errors import RemoteDataCorruptError
from tierlog.read.strategies import ReadStrategy

__all__ = ["stream"]  # the fixture


def user_chunk_positions(log_stream: Stream) -> list[tuple[str, int, int]]:
    """(segment path, position, chunk id) of every local user chunk with several records."""
    out = []
    with LogReader(log_stream.log, OffsetSpec.first(), user_only=False) as reader:
        for chunk in reader.chunks():
            h = chunk.header
            if h.chunk_type == ChunkType.USER and h.num_records > 1:
                out.append((chunk.segment_path, chunk.position, h.chunk_id))
    return out


def flip_type(path: str, position: int, to_type: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position + CHUNK_TYPE_POS)
        f.write(bytes([to_type]))


@pytest.mark.parametrize("to_type", [ChunkType.TRACKING_DELTA, ChunkType.TRACKING_SNAPSHOT])
def test_remote_chunk_whose_type_flipped_is_corrupt(stream: Stream, to_type: int) -> None:
    rng = random.Random(21)
    stream.append(rng, 150, max_size=60)
    stream.tier_all()
    stream.free()
    tree = stream.tierer.committer.tree
    second = list(tree.iter_fragments(stream.tierer.remote.load))[1]
    records = stream.manifest.fragment_index(second).records
    users = np.nonzero(records["chunk_type"] == ChunkType.USER)[0]
    n = int(users[len(users) // 2])
    data = bytearray(stream.store.get(second.key))
    data[int(records["position"][n]) + CHUNK_TYPE_POS] = to_type
    stream.store.put(second.key, bytes(data))
    with (
        stream.reader(OffsetSpec.first(), strategy=ReadStrategy.FORCE) as reader,
        pytest.raises(RemoteDataCorruptError, match="type"),
    ):
        tiered_records(reader)


def test_tiering_does_not_upload_a_user_chunk_typed_as_tracking(stream: Stream) -> None:
    rng = random.Random(22)
    stream.append(rng, 40, max_size=60)
    stream.tier_all()
    tiered = stream.tierer.durable_next
    stream.tierer.stop(flush=False, timeout=5)
    stream.append(rng, 40, max_size=60)
    path, position, chunk_id = next(c for c in user_chunk_positions(stream) if c[2] >= tiered)
    flip_type(path, position, ChunkType.TRACKING_DELTA)
    stream.tierer = type(stream.tierer)(
        stream.log,
        stream.store,
        stream.catalog,
        stream.deletions,
        config=stream.tierer.config,
        m=3,
    )
    stream.tierer.start()
    assert not stream.tierer.flush(5)
    assert stream.tierer.halted is not None and "not a valid tracking chunk" in stream.tierer.halted
    assert stream.tierer.durable_next <= chunk_id  # never uploaded


def test_local_type_flip_is_served_from_the_remote_copy(stream: Stream) -> None:
    """A local chunk whose type flipped after the open (whatever ``trusted_from`` says):
    the local reader refuses it, the cross-tier reader serves that chunk from the remote
    tier; nothing skipped."""
    rng = random.Random(23)
    stream.append(rng, 150, max_size=60)
    stream.tier_all()
    expected = local_records(stream.log, OffsetSpec.first())
    chunks = user_chunk_positions(stream)
    path, position, _ = chunks[len(chunks) // 2]
    flip_type(path, position, ChunkType.TRACKING_SNAPSHOT)
    with pytest.raises(CorruptChunkError, match="not a valid tracking chunk"):
        local_records(stream.log, OffsetSpec.first())
    with stream.reader(OffsetSpec.first(), strategy=ReadStrategy.NOT_IN_DISK) as reader:
        assert tiered_records(reader) == expected
