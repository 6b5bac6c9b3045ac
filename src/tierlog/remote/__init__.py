"""tierlog.remote: the remote tier's model, shared by its writer and its readers.

Object keys, the stream catalog and settings, the manifest tree and its one walker, the
committed-manifest reader, and fragment entries. No tiering decisions live here.
"""
