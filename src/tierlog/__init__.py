"""tierlog: a stream server whose streams are bottomless.

The library surface (``docs/library.md``): ``BottomlessLog`` opens one stream on a local
directory tiered to an object store; ``Record`` and ``Appended`` are what it hands back.
Everything else in the package is internal and may change between releases.

The names are loaded on first use: ``import tierlog.formats`` (a Spark worker, the CLI)
does not pay for the log, tiering and read packages behind them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from tierlog.embedded import Appended, BottomlessLog, Record, Start
    from tierlog.errors import TierlogError
    from tierlog.log.errors import LogClosedError
    from tierlog.remote.errors import OffsetOvertakenError

__all__ = [
    "Appended",
    "BottomlessLog",
    "LogClosedError",
    "OffsetOvertakenError",
    "Record",
    "Start",
    "TierlogError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name == "TierlogError":
        from tierlog.errors import TierlogError

        return TierlogError
    if name == "OffsetOvertakenError":
        from tierlog.remote.errors import OffsetOvertakenError

        return OffsetOvertakenError
    if name in __all__:
        import tierlog.embedded

        return getattr(tierlog.embedded, name)
    raise AttributeError(f"module 'tierlog' has no attribute {name!r}")
