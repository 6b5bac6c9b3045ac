"""Incremental splitting of a byte stream into stream-protocol frames.

Every frame is ``Size:uint32`` followed by ``Size`` bytes that start with ``Key:uint16
Version:uint16``. The splitter hands out each frame's ``Size`` bytes (without the size
prefix) as a memoryview into the data it was fed, so whole frames are never copied;
only a frame that arrives split across several ``feed`` calls is joined once.
"""

import struct

from tierlog.formats.protocol.constants import FRAME_SIZE_BYTES
from tierlog.formats.protocol.errors import FrameTooLargeError, ProtocolError

_SIZE = struct.Struct(">I")
_KEY_VERSION = struct.Struct(">HH")

MIN_FRAME_SIZE = 4
"""Smallest valid ``Size``: a frame holds at least its key and version."""


class FrameSplitter:
    """Feed bytes as they arrive, get whole frames back.

    ``max_frame_size`` counts the whole frame including its 4-byte size prefix, as
    clients do when they fill a frame up to the negotiated ``FrameMax``; 0 means no
    limit. It may be changed at any time (e.g. after Tune). A frame over the limit
    raises FrameTooLargeError as soon as its size prefix is seen, before its body is
    buffered. After an error the splitter must not be used again.

    Returned memoryviews point into the objects passed to ``feed``: callers must not
    mutate those objects while they still use the frames (``bytes`` is safe).
    """

    __slots__ = ("_parts", "_parts_len", "_wanted", "max_frame_size")

    def __init__(self, max_frame_size: int = 0) -> None:
        if max_frame_size < 0:
            raise ValueError("max_frame_size must be >= 0")
        self.max_frame_size = max_frame_size
        self._parts: list[bytes] = []  # the pending partial frame, size prefix included
        self._parts_len = 0
        self._wanted = 0  # total bytes (prefix included) of the pending frame, 0 = unknown

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that is not complete yet."""
        return self._parts_len

    def feed(self, data: bytes | bytearray | memoryview) -> list[memoryview]:
        """Add ``data``; return every frame it completes, in order."""
        view = data if isinstance(data, memoryview) else memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        frames: list[memoryview] = []
        pos = 0
        end = len(view)
        if self._parts_len:
            pos = self._complete_pending(view, frames)
            if self._parts_len:
                return frames
        max_size = self.max_frame_size
        size_unpack = _SIZE.unpack_from
        while end - pos >= FRAME_SIZE_BYTES:
            (size,) = size_unpack(view, pos)
            self._check_size(size, max_size)
            frame_end = pos + FRAME_SIZE_BYTES + size
            if frame_end > end:
                break
            frames.append(view[pos + FRAME_SIZE_BYTES : frame_end])
            pos = frame_end
        if pos < end:
            rest = bytes(view[pos:])
            self._parts = [rest]
            self._parts_len = len(rest)
            self._wanted = 0
            if len(rest) >= FRAME_SIZE_BYTES:
                (size,) = _SIZE.unpack_from(rest, 0)
                self._wanted = FRAME_SIZE_BYTES + size
        return frames

    def _complete_pending(self, view: memoryview, frames: list[memoryview]) -> int:
        """Extend the pending frame from ``view``; return how many bytes were consumed."""
        pos = 0
        if not self._wanted:
            need = FRAME_SIZE_BYTES - self._parts_len
            if len(view) < need:
                self._append(bytes(view))
                return len(view)
            self._append(bytes(view[:need]))
            pos = need
            head = b"".join(self._parts)
            self._parts = [head]
            (size,) = _SIZE.unpack_from(head, 0)
            self._check_size(size, self.max_frame_size)
            self._wanted = FRAME_SIZE_BYTES + size
        need = self._wanted - self._parts_len
        available = len(view) - pos
        if available < need:
            self._append(bytes(view[pos:]))
            return len(view)
        self._append(bytes(view[pos : pos + need]))
        whole = b"".join(self._parts)
        self._parts = []
        self._parts_len = 0
        self._wanted = 0
        frames.append(memoryview(whole)[FRAME_SIZE_BYTES:])
        return pos + need

    def _append(self, chunk: bytes) -> None:
        self._parts.append(chunk)
        self._parts_len += len(chunk)

    @staticmethod
    def _check_size(size: int, max_size: int) -> None:
        if size < MIN_FRAME_SIZE:
            raise ProtocolError(f"frame size {size} is too small to hold a key and version")
        if max_size and size + FRAME_SIZE_BYTES > max_size:
            raise FrameTooLargeError(size + FRAME_SIZE_BYTES, max_size)


def frame_key_version(frame: memoryview | bytes) -> tuple[int, int]:
    """Return (key with the response bit, version) of a frame as returned by the splitter."""
    if len(frame) < MIN_FRAME_SIZE:
        raise ProtocolError("frame too short for key and version")
    key, version = _KEY_VERSION.unpack_from(frame, 0)
    return key, version
