"""One stream-protocol connection: handshake, commands, publish and deliver paths.

``Connection`` composes the connection core (framing, handshake state, flow control,
the Deliver writer; ``connection_core``) with the command handlers of each area
(``handlers/``) and builds the dispatch table: one dict lookup per decoded frame, while
Publish frames go straight from ``data_received`` to ``_on_publish``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tierlog.formats.protocol.commands import (
    CloseRequest,
    ConsumerUpdateResponse,
    CreateRequest,
    CreateSuperStreamRequest,
    CreditRequest,
    DeclarePublisherRequest,
    DeletePublisherRequest,
    DeleteRequest,
    DeleteSuperStreamRequest,
    ExchangeCommandVersionsRequest,
    Heartbeat,
    MetadataRequest,
    OpenRequest,
    PartitionsRequest,
    PeerPropertiesRequest,
    QueryOffsetRequest,
    QueryPublisherSequenceRequest,
    RouteRequest,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
    SimpleResponse,
    StoreOffsetRequest,
    StreamStatsRequest,
    SubscribeRequest,
    Tune,
    UnknownCommand,
    UnsubscribeRequest,
)
from tierlog.server.handlers.consumers import ConsumerHandlers
from tierlog.server.handlers.handshake import HandshakeHandlers
from tierlog.server.handlers.publishers import PublisherHandlers
from tierlog.server.handlers.streams import StreamHandlers
from tierlog.server.handlers.super_streams import SuperStreamHandlers


class Connection(
    HandshakeHandlers, StreamHandlers, SuperStreamHandlers, PublisherHandlers, ConsumerHandlers
):
    """The server side of one client connection."""

    def _dispatch_table(self) -> dict[type, Callable[[Any], None]]:
        return {
            PeerPropertiesRequest: self._on_peer_properties,
            SaslHandshakeRequest: self._on_sasl_handshake,
            SaslAuthenticateRequest: self._on_sasl_authenticate,
            Tune: self._on_tune,
            OpenRequest: self._on_open,
            Heartbeat: lambda _c: None,
            CloseRequest: self._on_close,
            SimpleResponse: lambda _c: None,  # e.g. the answer to our Close
            ConsumerUpdateResponse: self._on_consumer_update,  # single active consumer
            CreateRequest: self._spawn(self._on_create),
            DeleteRequest: self._spawn(self._on_delete),
            MetadataRequest: self._on_metadata,
            StreamStatsRequest: self._spawn(self._on_stream_stats),
            RouteRequest: self._spawn(self._on_route),
            PartitionsRequest: self._spawn(self._on_partitions),
            CreateSuperStreamRequest: self._spawn(self._on_create_super_stream),
            DeleteSuperStreamRequest: self._spawn(self._on_delete_super_stream),
            ExchangeCommandVersionsRequest: self._on_exchange_versions,
            DeclarePublisherRequest: self._on_declare_publisher,
            QueryPublisherSequenceRequest: self._on_query_publisher_sequence,
            DeletePublisherRequest: self._on_delete_publisher,
            SubscribeRequest: self._on_subscribe,
            CreditRequest: self._on_credit,
            StoreOffsetRequest: self._on_store_offset,
            QueryOffsetRequest: self._spawn(self._on_query_offset),
            UnsubscribeRequest: self._spawn(self._on_unsubscribe),
            UnknownCommand: self._on_unknown,
        }
