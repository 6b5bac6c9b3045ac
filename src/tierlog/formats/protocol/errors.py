"""Typed errors of the stream protocol codec."""

from tierlog.formats.errors import FormatError, InvalidSizeError, TruncatedError


class ProtocolError(FormatError):
    """A frame is malformed: the connection that sent it cannot be trusted any more."""


class TruncatedFrameError(ProtocolError, TruncatedError):
    """A frame ends before one of its fields does."""


class FrameTooLargeError(ProtocolError, InvalidSizeError):
    """A frame is larger than the negotiated maximum frame size."""

    def __init__(self, size: int, max_size: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the maximum of {max_size} bytes")
        self.size = size
        self.max_size = max_size
