"""Helpers shared by test areas: waiting for a condition, the process keyring, reading a
log's records, stream arguments that make tiering fast. One copy each, imported by the
tests that had their own."""
