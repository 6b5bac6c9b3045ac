"""The tail's head while a stream has no leader: StreamStats answers STREAM_NOT_AVAILABLE
(retriable). A streaming micro-batch keeps the remote tier's end as its head (the tail is
read by a later micro-batch); a batch read fails with the error; any other refusal fails
at once. No Spark session needed: the policy around one StreamStats exchange."""

from __future__ import annotations

import pytest

from tierlog.formats.protocol.constants import ResponseCode
from tierlog.spark import tail
from tierlog.spark.errors import ResponseError
from tierlog.spark.tail import ServerAddress, committed_end

SERVER = ServerAddress("127.0.0.1", 1, "guest", "guest", 1.0)


def refusing(code: int, answers: list[int] | None = None) -> object:
    calls: list[int] = []

    def fake(server: ServerAddress, vhost: str, name: str, floor: int) -> int:
        calls.append(1)
        if answers and len(calls) > answers[0]:
            return answers[1]
        raise ResponseError("stream stats", code)

    fake.calls = calls  # type: ignore[attr-defined]
    return fake


def test_streaming_keeps_the_tier_end_while_no_leader_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tail, "UNAVAILABLE_RETRY_S", 0.6)
    fake = refusing(ResponseCode.STREAM_NOT_AVAILABLE)
    monkeypatch.setattr(tail, "_committed_end", fake)
    assert committed_end(SERVER, "/", "s", 40, streaming=True) == 40
    assert len(fake.calls) >= 2  # type: ignore[attr-defined]  # asked again first
    with pytest.raises(ResponseError):
        committed_end(SERVER, "/", "s", 40)  # a batch read is refused, never shortened


def test_a_leader_back_within_the_window_gives_the_real_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tail, "UNAVAILABLE_RETRY_S", 5.0)
    monkeypatch.setattr(
        tail, "_committed_end", refusing(ResponseCode.STREAM_NOT_AVAILABLE, [1, 97])
    )
    assert committed_end(SERVER, "/", "s", 40) == 97


def test_other_refusals_fail_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = refusing(ResponseCode.ACCESS_REFUSED)
    monkeypatch.setattr(tail, "_committed_end", fake)
    with pytest.raises(ResponseError):
        committed_end(SERVER, "/", "s", 40, streaming=True)
    assert len(fake.calls) == 1  # type: ignore[attr-defined]
