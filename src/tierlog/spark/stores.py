"""Checks that the stores a Spark read or job names are the ones that hold the data.

Opening a filesystem object store or an SQLite MetaStore at a path that does not exist
would quietly give an *empty* store: on an executor without the path (a cluster node
where ``file://`` / ``sqlite://`` means its own disk) a scrub would report every fragment
missing, and a mistyped path would make it report ``ok``. So Spark code never opens a
path-based store that is not there (``require_existing``), refuses host-local stores on
a cluster master unless told the path is shared (``check_master``), and jobs check that
the MetaStore holds streams and the object store holds their manifests before running.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from tierlog.errors import ConfigError
from tierlog.spark.errors import StoreMissingError

HOST_LOCAL_SCHEMES = ("file", "sqlite")


def _scheme(uri: str) -> str:
    return urlsplit(uri).scheme.lower()


def is_host_local(uri: str) -> bool:
    """A store that lives on one host's filesystem (``file://``, ``sqlite://``)."""
    return _scheme(uri) in HOST_LOCAL_SCHEMES


def is_local_master(master: str) -> bool:
    """Driver and executors share one host: ``local``, ``local[N]``, ``local[N,F]``."""
    return master == "local" or master.startswith("local[")


def require_existing(uri: str, what: str) -> None:
    """Refuse a path-based store whose file or directory is not there (never create it).

    ``what`` names the setting in the message (``objectStore``, ``--meta-store``, ...).
    Remote stores (S3, etcd) are checked by their first request.
    """
    scheme = _scheme(uri)
    if scheme not in HOST_LOCAL_SCHEMES:
        return
    path = unquote(urlsplit(uri).path)
    host = os.uname().nodename
    if scheme == "file" and not os.path.isdir(path):
        raise StoreMissingError(
            f"{what} {uri!r}: no directory {path!r} on host {host!r} (a file:// store is "
            "never created by a reader; on a cluster every executor needs the same path)"
        )
    if scheme == "sqlite" and not os.path.isfile(path):
        raise StoreMissingError(
            f"{what} {uri!r}: no database file {path!r} on host {host!r} (an sqlite:// "
            "MetaStore is never created by a reader; on a cluster every executor needs the "
            "same path)"
        )


def check_master(master: str, uris: dict[str, str], shared_paths: bool) -> None:
    """Refuse host-local stores when executors may run on other hosts.

    ``uris`` maps a setting name to its URI. ``shared_paths`` says the paths are mounted
    at the same place on every node (NFS and the like): then the existence checks each
    executor makes when it opens the store are what protects the read.
    """
    if is_local_master(master) or shared_paths:
        return
    local = [f"{name}={uri}" for name, uri in uris.items() if is_host_local(uri)]
    if local:
        raise ConfigError(
            f"master {master!r} runs executors on other hosts, but {', '.join(local)} "
            "name(s) a path on this host's disk: an executor elsewhere would read an empty "
            "or missing store. Use s3:// and etcd://, or pass --shared-paths if the path is "
            "on a filesystem mounted at the same place on every node"
        )
