"""Typed errors of the message store (``tierlog.msgstore``)."""

from tierlog.errors import ConfigError, TierlogError


class MsgStoreError(TierlogError):
    """Base class of message-store errors."""


class MsgStoreConfigError(ConfigError):
    """A message-store setting is out of range."""


class MsgNotFoundError(MsgStoreError, KeyError):
    """No live message with this msg id is in the store."""


class StoreClosedError(MsgStoreError):
    """The store was closed."""


class MixedStoreError(MsgStoreError):
    """Segment files contradict the ``last_v1_file`` boundary (a ``.sqs`` numbered at or below
    a ``.rdq``, or one number with both extensions and no migration to explain it)."""


class CorruptSegmentError(MsgStoreError):
    """A segment file does not scan (zero-filled region, unknown type, bad size): the store
    refuses to open rather than guess; the message names the file and position."""


class NotADirectoryStoreError(MsgStoreError):
    """The path is not a directory."""
