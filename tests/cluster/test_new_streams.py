"""A never-led stream is its creator's for one lease TTL: the other voters' scans leave it
alone, so a creation (register, then acquire) never races them (seen in CI: a voter took
a stream between the creator's two steps and the Create failed with NotLeaderError)."""

from __future__ import annotations

from tierlog.cluster.new_streams import NeverLedStreams


def test_a_never_led_stream_waits_one_ttl_from_first_sight() -> None:
    streams = NeverLedStreams(ttl=5.0)
    assert not streams.may_take("s", 0, now=100.0)  # first seen: the creator acquires it
    assert not streams.may_take("s", 0, now=104.9)
    assert streams.may_take("s", 0, now=105.0)  # the creator did not: a voter takes it


def test_a_stream_led_once_is_taken_over_at_once() -> None:
    streams = NeverLedStreams(ttl=5.0)
    assert not streams.may_take("s", 0, now=100.0)
    assert streams.may_take("s", 1, now=100.1)  # led in epoch 1, leader gone: fail over
    assert streams.may_take("t", 3, now=0.0)


def test_entries_stay_bounded() -> None:
    streams = NeverLedStreams(ttl=5.0, max_entries=10)
    for i in range(25):
        streams.may_take(f"s{i}", 0, now=float(i))
    assert len(streams) <= 10
