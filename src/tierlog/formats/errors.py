"""Typed errors raised by decoders in ``tierlog.formats``."""

from tierlog.errors import TierlogError


class FormatError(TierlogError, ValueError):
    """Bytes do not form a valid object of the expected format."""


class TruncatedError(FormatError):
    """The input ends before the object does."""


class BadMagicError(FormatError):
    """A magic number or version does not match."""


class CrcMismatchError(FormatError):
    """A stored checksum does not match the data it covers."""


class InvalidSizeError(FormatError):
    """A length, count or size field is impossible."""


class UnsupportedError(FormatError):
    """The input is well-formed but uses a feature tierlog does not support."""


class RecordSizeError(InvalidSizeError):
    """An entry is over a configured size limit (the data itself is well-formed)."""


class ErlangTermError(FormatError):
    """Bytes are not a valid term in Erlang's external term format."""


class TruncatedTermError(ErlangTermError, TruncatedError):
    """A term ends past the end of its buffer."""


class UnsupportedTermError(ErlangTermError, UnsupportedError):
    """A term uses a tag this decoder does not handle."""


class AmqpError(FormatError):
    """Bytes are not a valid AMQP 1.0 message."""


class AmqpTruncatedError(AmqpError, TruncatedError):
    """An AMQP value ends past the end of the input."""


class EtsFileError(FormatError):
    """A file is not a complete, closed ``ets:tab2file`` dump of the expected table."""


class TruncatedEtsFileError(EtsFileError, TruncatedError):
    """The dump ends inside an item (or without its end-of-table marker)."""


class BadPaddingError(FormatError):
    """Bytes that must be padding (header zeros or the FEDCDEAD pattern) are something else."""


class LayoutMismatchError(FormatError):
    """The index's block mappings or lengths disagree with the layout its records imply."""


class CleanFileError(FormatError):
    """A clean-shutdown file is damaged (bad magic, cut off, CRC mismatch)."""


class MsgStoreFormatError(FormatError):
    """Bytes of a message-store file do not form valid records."""


class ZeroFilledRegionError(MsgStoreFormatError):
    """A record starts with type 0: a zero-filled or uninitialised region where records belong."""


class UnknownRecordTypeError(MsgStoreFormatError):
    """A record starts with a type byte this version does not know (5..255)."""


class MsgStoreRecordSizeError(MsgStoreFormatError, InvalidSizeError):
    """A record's size field is below its type's minimum or not what the caller expected."""


class TornRecordError(MsgStoreFormatError, TruncatedError):
    """A record extends past the end of the file or buffer (a torn write)."""


class RecordChecksumError(MsgStoreFormatError, CrcMismatchError):
    """A MESSAGE_WITH_CHECKSUM's CRC does not match its msg id and body (a bit flip)."""


class MsgIdMismatchError(MsgStoreFormatError):
    """The record at an indexed position holds another message than the index says."""


class NotAMessageError(MsgStoreFormatError):
    """The record at an indexed position is a hole, not a message."""


class SegmentHeaderError(MsgStoreFormatError, BadMagicError):
    """A v2 segment header has the wrong magic or version."""


class V1RecordError(MsgStoreFormatError):
    """Bytes at a v1 (``.rdq``) position are not a complete record with its 255 trailer."""


class AuthenticationError(FormatError):
    """A sealed frame or wrapped key does not authenticate: tampered, moved or wrong key."""


class UnknownKeyError(UnsupportedError):
    """The object was sealed under a key-encryption key that is not configured."""
