"""RabbitMQ Stream protocol: frame splitting and command codecs (pure bytes, no I/O).

``frames`` splits a byte stream into frames. Commands are declared once, as field
schemas (``schema``: typed fields, one generic encoder and decoder), by area:
``handshake`` (connection set-up), ``streams``, ``publishers`` and ``consumers``.
``publish`` and ``deliver`` hold the hand-specialised hot paths (Publish decoding and
encoding, PublishConfirm encoding, the Deliver prefix sent in front of raw Osiris chunk
bytes). ``commands`` re-exports every command and decodes any frame in either direction.
"""
