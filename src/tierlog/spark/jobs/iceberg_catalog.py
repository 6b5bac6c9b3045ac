"""Which Iceberg catalog the export commits to, checked before any Spark work starts.

Two kinds, both through pyiceberg (no Iceberg runtime jar in Spark):

* ``sql`` (default): an embedded SQL catalog in a SQLite file, by default
  ``{warehouse}/catalog.db``; data files under the warehouse directory.
* ``rest``: an Iceberg REST catalog at an ``http(s)://`` URI; table locations come from
  the catalog. Extra catalog properties (``token``, ``credential``, ``warehouse``, ...)
  pass through as given. Opening the catalog fetches its config, so an unreachable or
  refusing server is an ``IcebergCatalogError`` before Spark starts.

Catalog properties may hold credentials: they are never printed, logged or put into the
job report (``describe`` names the kind and URI only).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from tierlog.errors import ConfigError
from tierlog.spark.errors import IcebergCatalogError

CATALOG_NAME = "tierlog"
DEFAULT_NAMESPACE = "tierlog"
SQLITE_FILE = "catalog.db"
CatalogKind = Literal["sql", "rest"]


@dataclass(frozen=True)
class IcebergCatalogConfig:
    """A checked catalog configuration (see ``catalog_config``)."""

    kind: CatalogKind
    uri: str
    warehouse: str | None
    namespace: str = DEFAULT_NAMESPACE
    properties: dict[str, str] = field(default_factory=dict, repr=False)

    def describe(self) -> dict[str, str | None]:
        """What the report may show (no properties: they can hold credentials)."""
        return {"kind": self.kind, "uri": self.uri, "namespace": self.namespace}


def catalog_config(
    kind: str,
    warehouse: str | None,
    uri: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    properties: list[str] | None = None,
) -> IcebergCatalogConfig:
    """Check the export's catalog settings; every mistake is a ``ConfigError``."""
    props: dict[str, str] = {}
    for pair in properties or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--catalog-prop takes KEY=VALUE, got {pair!r}")
        props[key.strip()] = value
    if not namespace or any(not part for part in namespace.split(".")):
        raise ConfigError(f"Iceberg namespace {namespace!r} is not a dotted name")
    if kind == "sql":
        return _sql_config(warehouse, uri, namespace, props)
    if kind == "rest":
        if not uri:
            raise ConfigError("an Iceberg REST catalog needs --catalog-uri http(s)://host:port")
        parts = urlsplit(uri)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"Iceberg REST catalog URI must be http(s)://host[:port], got {uri!r}"
            )
        try:
            parts.port  # noqa: B018 -- raises on a bad port
        except ValueError as exc:
            raise ConfigError(f"Iceberg REST catalog URI {uri!r}: {exc}") from None
        return IcebergCatalogConfig("rest", uri, warehouse, namespace, props)
    raise ConfigError(f"unknown Iceberg catalog kind {kind!r} (sql or rest)")


def _sql_config(
    warehouse: str | None, uri: str | None, namespace: str, props: dict[str, str]
) -> IcebergCatalogConfig:
    if not warehouse:
        raise ConfigError("an Iceberg export needs an output (warehouse) directory")
    local = warehouse[len("file://") :] if warehouse.startswith("file://") else warehouse
    if "://" in local:
        raise ConfigError(
            f"the embedded SQL catalog keeps its warehouse on a local or mounted path, got "
            f"{warehouse!r} (use a REST catalog for object-store warehouses)"
        )
    local = os.path.abspath(local)
    if uri is None:
        uri = f"sqlite:///{os.path.join(local, SQLITE_FILE)}"
    elif not uri.startswith("sqlite:///"):
        raise ConfigError(f"the embedded SQL catalog URI must be sqlite:///path, got {uri!r}")
    return IcebergCatalogConfig("sql", uri, f"file://{local}", namespace, props)


def open_catalog(config: IcebergCatalogConfig) -> Any:
    """The pyiceberg catalog, its namespace created if missing (the export's output)."""
    try:
        if config.kind == "sql":
            from pyiceberg.catalog.sql import SqlCatalog

            assert config.warehouse is not None
            os.makedirs(config.warehouse[len("file://") :], exist_ok=True)
            catalog: Any = SqlCatalog(
                CATALOG_NAME, uri=config.uri, warehouse=config.warehouse, **config.properties
            )
        else:
            from pyiceberg.catalog.rest import RestCatalog

            extra = dict(config.properties)
            if config.warehouse:
                extra.setdefault("warehouse", config.warehouse)
            catalog = RestCatalog(CATALOG_NAME, uri=config.uri, **extra)
        catalog.create_namespace_if_not_exists(config.namespace)
    except ImportError as exc:
        raise IcebergCatalogError(
            f"pyiceberg is not installed ({exc}); install tierlog[spark]"
        ) from None
    except (ConfigError, IcebergCatalogError):
        raise
    except Exception as exc:  # requests / sqlalchemy / pyiceberg errors, whatever the kind
        raise IcebergCatalogError(
            f"Iceberg {config.kind} catalog at {config.uri} is not usable: "
            f"{type(exc).__name__}: {_first_line(exc)}"
        ) from None
    return catalog


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
