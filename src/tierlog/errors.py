"""The root of tierlog's typed errors.

Every layer defines its own subclasses next to its code (``formats.errors``,
``storage.errors``, ...); callers may catch ``TierlogError`` to catch them all.
"""


class TierlogError(Exception):
    """Base class of every error tierlog raises on purpose."""


class ConfigError(TierlogError, ValueError):
    """A configuration value or name is invalid."""
