"""RabbitMQ Stream protocol: frame splitting and command codecs (pure bytes, no I/O).

``frames`` splits a byte stream into frames; ``commands`` encodes and decodes every
command in both directions; ``publish`` and ``deliver`` hold the hot paths (Publish
decoding, PublishConfirm encoding, the Deliver frame prefix sent in front of raw
Osiris chunk bytes).
"""
