"""The typed-record message store: messages removed out of order, v2 ``.sqs`` segments with
HOLE markers, RabbitMQ v1 ``.rdq`` segments read in place and migrated (docs/msgstore.md)."""

from tierlog.msgstore.errors import (
    CorruptSegmentError,
    MixedStoreError,
    MsgNotFoundError,
    MsgStoreError,
    StoreClosedError,
)
from tierlog.msgstore.store import MessageStore, MsgStoreConfig

__all__ = [
    "CorruptSegmentError",
    "MessageStore",
    "MixedStoreError",
    "MsgNotFoundError",
    "MsgStoreConfig",
    "MsgStoreError",
    "StoreClosedError",
]
