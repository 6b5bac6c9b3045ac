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
