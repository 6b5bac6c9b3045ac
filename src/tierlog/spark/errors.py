"""Typed errors of ``tierlog.spark``: the data source, the stream client, the writer and the
maintenance jobs."""

from __future__ import annotations

from collections.abc import Sequence

from tierlog.errors import TierlogError
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.server.errors import StoreUnavailableError


class SparkSourceError(TierlogError):
    """Base class of the Spark data source's errors."""


class StreamUnavailableError(SparkSourceError):
    """A stream named in the options does not exist (or was deleted while reading)."""


class StreamClientError(TierlogError):
    """The server refused a request or the connection failed."""


class ResponseError(StreamClientError):
    """A request answered with a response code other than OK."""

    def __init__(self, what: str, code: int) -> None:
        try:
            name = ResponseCode(code).name
        except ValueError:
            name = f"code {code:#x}"
        super().__init__(f"{what}: {name}")
        self.code = code


class PublishFailedError(StreamClientError):
    """The server answered some publishing ids with PublishError."""

    def __init__(self, errors: Sequence[tuple[int, int]]) -> None:
        first_id, code = errors[0]
        super().__init__(
            f"{len(errors)} messages not stored (first: publishing id {first_id}, code {code:#x})"
        )
        self.errors = list(errors)


class WriterError(TierlogError):
    """The writer cannot publish this DataFrame (bad options or schema)."""


class JobError(TierlogError):
    """A maintenance job cannot run (bad arguments, unreachable stores)."""


class StoreMissingError(StoreUnavailableError):
    """A store named by URI does not exist, or does not hold what it should."""


class IcebergCatalogError(JobError):
    """The Iceberg catalog cannot be reached or refuses what the export needs."""


class PartitionCountChangedError(WriterError):
    """A replayed micro-batch has another number of partitions than its first attempt."""

    def __init__(self, batch_id: int, first: int, replay: str) -> None:
        super().__init__(
            f"micro-batch {batch_id} was first written with {first} partition(s) and is now "
            f"replayed with {replay}: publishing ids derive from the partition and the row "
            "position, so this replay could store rows twice and is refused. Restart the "
            "query with the partitioning of the first attempt (the same repartition(n), "
            "file split size, shuffle partitions) to finish this micro-batch, then change "
            "it. Rows of partitions that exist in both attempts may already have been "
            "published by this replay."
        )
        self.batch_id = batch_id
        self.first = first
