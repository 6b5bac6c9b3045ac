"""Fuzzing the stream protocol codec: random and mutated frames raise only typed errors."""

from __future__ import annotations

import contextlib
import os
import struct
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.formats.test_protocol_codec import _publish_frame, client_commands, server_commands
from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.fuzz import run_fuzz
from tierlog.formats.errors import FormatError
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import Command
from tierlog.formats.protocol.deliver import decode_deliver
from tierlog.formats.protocol.frames import FrameSplitter
from tierlog.formats.protocol.publish import decode_publish


def decode_everything(data: bytes, max_frame_size: int = 0) -> int:
    """Split ``data`` and decode each frame in both directions; return the frame count.

    Any exception that is not a FormatError escapes and fails the test.
    """
    frames = FrameSplitter(max_frame_size).feed(data)
    for body in frames:
        for decode in (c.decode_client_frame, c.decode_server_frame):
            try:
                command = decode(body)
            except FormatError:
                continue
            if isinstance(command, c.UnknownCommand):
                command.error_response()
    return len(frames)


def mutate(data: bytes, draw: st.DrawFn) -> bytes:
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        if not buf:
            break
        pos = draw(st.integers(0, len(buf) - 1))
        if kind == "flip":
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            buf[pos] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))
        elif kind == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete":
            del buf[pos]
        else:
            del buf[pos:]
    return bytes(buf)


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    source = draw(st.sampled_from(["client", "server", "publish"]))
    if source == "client":
        wire = draw(client_commands).encode()
    elif source == "server":
        wire = draw(server_commands).encode()
    else:
        wire = _publish_frame(draw(st.data()))
    # Keep the size prefix honest half of the time so the body parsers get exercised.
    mutated = mutate(wire, draw)
    if draw(st.booleans()) and len(mutated) >= 8:
        mutated = struct.pack(">I", len(mutated) - 4) + mutated[4:]
    return mutated


@given(st.binary(max_size=300))
def test_random_bytes_raise_only_typed_errors(data: bytes) -> None:
    with contextlib.suppress(FormatError):
        decode_everything(data)


@given(st.integers(0, 0xFFFF), st.integers(0, 3), st.binary(max_size=120))
def test_random_bodies_for_every_key_raise_only_typed_errors(
    key: int, version: int, payload: bytes
) -> None:
    body = struct.pack(">HH", key, version) + payload
    frame = struct.pack(">I", len(body)) + body
    assert decode_everything(frame) == 1


@given(st.sampled_from(list(Command)), st.sampled_from([0, 0x8000]), st.binary(max_size=80))
def test_known_keys_with_random_payload(command: Command, flag: int, payload: bytes) -> None:
    body = struct.pack(">HH", command | flag, 1) + payload
    assert decode_everything(struct.pack(">I", len(body)) + body) == 1


@given(mutated_frames())
def test_mutated_valid_frames_raise_only_typed_errors(frame: bytes) -> None:
    with contextlib.suppress(FormatError):
        decode_everything(frame, max_frame_size=4096)


@given(st.binary(max_size=200))
def test_hot_path_decoders_on_random_bodies(payload: bytes) -> None:
    for version in (1, 2):
        body = struct.pack(">HHBI", Command.PUBLISH, version, 1, len(payload) // 13) + payload
        try:
            batch = decode_publish(body)
        except FormatError:
            continue
        assert len(batch.publishing_ids) == len(batch.entries)
        assert batch.num_records >= len(batch.entries)
    for version in (1, 2):
        with contextlib.suppress(FormatError):
            decode_deliver(struct.pack(">HHB", Command.DELIVER, version, 0) + payload)


@given(st.lists(mutated_frames(), min_size=1, max_size=5), st.lists(st.integers(1, 50)))
def test_splitter_survives_mutated_streams_in_pieces(frames: list[bytes], cuts: list[int]) -> None:
    data = b"".join(frames)
    splitter = FrameSplitter(max_frame_size=4096)
    pos = 0
    try:
        for cut in [*cuts, len(data)]:
            for body in splitter.feed(data[pos : pos + cut]):
                with contextlib.suppress(FormatError):
                    c.decode_client_frame(body)
            pos += cut
    except FormatError:
        pass


def test_running_server_survives_fuzzed_sessions(tmp_path: Path) -> None:
    """Random and mutated valid frames before and after authentication against a server
    process: it stays up, its RSS stays bounded and a healthy client is served."""
    frames = int(os.environ.get("TIERLOG_FUZZ_FRAMES", "3000"))
    config = '[tier]\nenabled = false\n[server]\nlog_level = "ERROR"\n'
    server = TierlogServerProcess(tmp_path / "data", config_text=config).start()
    try:
        report = run_fuzz(server, frames, seed=13, health_every=1000)
    finally:
        server.stop()
    assert report.frames == frames
    assert report.preauth_sessions > 0 and report.sessions > report.preauth_sessions
    assert report.closed_by_server > 0  # malformed frames close the connection
    assert report.rss_growth_mib < 128, report.summary()
    assert report.health_checks >= frames // 1000
