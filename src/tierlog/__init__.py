"""tierlog: a stream server whose streams are bottomless."""

__version__ = "0.1.0"
