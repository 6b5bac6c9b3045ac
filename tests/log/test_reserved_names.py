"""The one rule for names the server keeps for itself (``log/names.py``): every kind of
name a client gives is checked by it, the server's own names fall under it, and the super
stream rule covers every partition."""

from __future__ import annotations

import pytest

from tierlog.log.errors import InvalidStreamNameError, ReservedNameError
from tierlog.log.names import (
    CLIENT_NAME_KINDS,
    RESERVED_PREFIX,
    check_client_name,
    check_super_stream,
    is_reserved,
)
from tierlog.server.delayed_intake import DISPATCHER_REFERENCE, SYSTEM_PREFIX, system_stream_name


def test_the_servers_own_names_are_reserved() -> None:
    for name in (DISPATCHER_REFERENCE, SYSTEM_PREFIX, system_stream_name("orders")):
        assert is_reserved(name)
        for kind in CLIENT_NAME_KINDS:
            with pytest.raises(ReservedNameError):
                check_client_name(kind, name)


@pytest.mark.parametrize("kind", CLIENT_NAME_KINDS)
def test_every_kind_of_client_name_is_checked(kind: str) -> None:
    with pytest.raises(ReservedNameError) as raised:
        check_client_name(kind, RESERVED_PREFIX + "_anything")
    assert raised.value.kind == kind and RESERVED_PREFIX in str(raised.value)
    assert isinstance(raised.value, InvalidStreamNameError)  # a ConfigError: typed, clear
    for fine in ("orders", "_tierlog", "tierlog__", "x__tierlog", "__TIERLOG", "", None):
        check_client_name(kind, fine)


def test_an_unknown_kind_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        check_client_name("exchange", "x")


def test_the_super_stream_rule_covers_the_name_and_every_partition() -> None:
    check_super_stream("invoices", ["invoices-0", "invoices-1"])
    with pytest.raises(ReservedNameError) as raised:
        check_super_stream("__tierlog_super", ["a"])
    assert raised.value.kind == "super stream"
    with pytest.raises(ReservedNameError) as raised:
        check_super_stream("invoices", ["invoices-0", "__tierlog_delayed.invoices"])
    assert raised.value.kind == "partition"
