"""The distributed MetaStore: a real etcd cluster through the async ``aetcd`` client.

The client runs on a dedicated event-loop thread; the synchronous MetaStore methods
submit coroutines with ``run_coroutine_threadsafe``. Layout under ``{prefix}/``:

- ``kv/{key}``: 8-byte big-endian epoch + value. The version is the key's
  ``mod_revision``: unique cluster-wide and growing, so never reused after delete and
  re-create.
- ``queue/{queue}\\x00{uuid}``: a cleanup item; its ``create_revision`` is its item id
  (keys may contain ``/`` but never NUL, so one queue's range never holds another's).
- ``lease/{name}``: the holder, attached to an etcd lease (TTL) and deleted by etcd on
  expiry; ``lease-epoch/{name}``: the lease's epoch, bumped in the acquiring transaction,
  kept forever so every acquisition gets a larger epoch. etcd TTLs are whole seconds:
  a TTL is rounded up (at least 1 s; the server may raise it to its minimum), and a
  renewal refreshes the TTL granted at acquisition.

Why ``put_if`` is atomic although the epoch check runs in the client: the client reads
the key, checks version and epoch against that read, then commits with a transaction
whose only compare is ``mod_revision == expected``. Every write to a key gives it a new,
never reused ``mod_revision``, so if the compare holds at commit time the stored value,
and with it the epoch just checked, is exactly the one read: nothing happened between
the read and the commit that the checks did not see.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import math
import struct
import threading
import time
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

import aetcd
import grpc

from tierlog.storage.errors import (
    AlreadyExistsError,
    EpochFencedError,
    KeyDeletedError,
    LeaseHeldError,
    LeaseLostError,
    NotFoundError,
    PermanentError,
    StorageError,
    TransientError,
    VersionConflictError,
)
from tierlog.storage.etcd_client import EtcdTls, new_etcd_client
from tierlog.storage.meta_store import (
    CleanupItem,
    Lease,
    MetaStore,
    Versioned,
    validate_epoch,
    validate_meta_key,
    validate_meta_prefix,
    validate_meta_value,
    validate_ttl,
    validate_version,
)

T = TypeVar("T")

_EPOCH = struct.Struct(">Q")
DEFAULT_TIMEOUT_S = 5.0
MAX_GRPC_MESSAGE_BYTES = 256 << 20
_ACQUIRE_ATTEMPTS = 8

_TRANSIENT_CODES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.CANCELLED,
}


def _grpc_code(exc: BaseException) -> grpc.StatusCode | None:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, grpc.aio.AioRpcError):
            code: grpc.StatusCode = cause.code()
            return code
        cause = cause.__cause__
    return None


def _translate(exc: BaseException, where: str) -> StorageError:
    """Map aetcd / grpc / asyncio failures to typed storage errors."""
    if isinstance(
        exc,
        aetcd.ConnectionFailedError
        | aetcd.ConnectionTimeoutError
        | aetcd.WatchTimeoutError
        | asyncio.TimeoutError
        | concurrent.futures.TimeoutError
        | ConnectionError,
    ):
        return TransientError(f"etcd {where}: unavailable or timed out: {exc}")
    code = _grpc_code(exc)
    if code is None or code in _TRANSIENT_CODES:
        return TransientError(f"etcd {where}: {exc}")
    return PermanentError(f"etcd {where}: {code.name}: {exc}")


class EtcdMetaStore(MetaStore):
    """MetaStore on etcd; every method is safe to call from any thread."""

    def __init__(
        self,
        host: str,
        port: int,
        prefix: str = "tierlog",
        timeout: float = DEFAULT_TIMEOUT_S,
        username: str | None = None,
        password: str | None = None,
        tls: EtcdTls | None = None,
    ) -> None:
        validate_meta_key(prefix)
        self._tls = tls
        self.endpoint = f"{host}:{port}"
        self._timeout = float(timeout)
        root = prefix.strip("/").encode() + b"/"
        self._kv_root = root + b"kv/"
        self._queue_root = root + b"queue/"
        self._lease_root = root + b"lease/"
        self._epoch_root = root + b"lease-epoch/"
        self._seen_revision: dict[str, int] = {}  # queue -> revision of last pending()
        self._seen_lock = threading.Lock()
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"tierlog-etcd-{self.endpoint}", daemon=True
        )
        self._thread.start()
        try:
            self._client = self._run(self._new_client(username, password), "connect")
            # Fail fast and clearly on a bad endpoint instead of on first use.
            self._run(self._client.get(self._kv_root), f"connect to {self.endpoint}")
        except BaseException:
            self.close()
            raise

    async def _new_client(self, username: str | None, password: str | None) -> aetcd.Client:
        host, _, port = self.endpoint.rpartition(":")
        return new_etcd_client(
            self._tls,
            host=host,
            port=int(port),
            username=username,
            password=password,
            timeout=self._timeout,
            options={
                "grpc.max_receive_message_length": MAX_GRPC_MESSAGE_BYTES,
                "grpc.max_send_message_length": MAX_GRPC_MESSAGE_BYTES,
            },
        )

    # --- plumbing ------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T], where: str, wait: float = 0.0) -> T:
        """Run ``coro`` on the loop thread; never blocks much past the call timeout."""
        if self._closed:
            coro.close()
            raise PermanentError(f"etcd {self.endpoint}: metadata store is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self._timeout + wait + 1.0)
        except StorageError:
            raise
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise _translate(exc, f"{self.endpoint} {where}") from exc
        except (TimeoutError, aetcd.ClientError, grpc.RpcError, OSError) as exc:
            raise _translate(exc, f"{self.endpoint} {where}") from exc

    def _kv_key(self, key: str) -> bytes:
        return self._kv_root + validate_meta_key(key).encode()

    def _queue_prefix(self, queue: str) -> bytes:
        return self._queue_root + validate_meta_key(queue).encode() + b"\x00"

    @staticmethod
    def _decode(key: str, kv: Any) -> Versioned:
        raw = bytes(kv.value)
        if len(raw) < _EPOCH.size:
            raise PermanentError(f"etcd key {key!r} holds {len(raw)} bytes, not a tierlog value")
        (epoch,) = _EPOCH.unpack_from(raw)
        return Versioned(key, raw[_EPOCH.size :], int(kv.mod_revision), int(epoch))

    def _get_raw(self, key: str) -> Any:
        return self._run(self._client.get(self._kv_key(key)), f"get {key!r}")

    # --- keys ------------------------------------------------------------------------
    def get(self, key: str) -> Versioned | None:
        kv = self._get_raw(key)
        return None if kv is None else self._decode(key, kv)

    def create(self, key: str, value: bytes, epoch: int = 0) -> Versioned:
        full = self._kv_key(key)
        value = validate_meta_value(value)
        validate_epoch(epoch)
        tx = self._client.transactions
        ok, responses = self._run(
            self._client.transaction(
                compare=[tx.create(full) == 0],
                success=[tx.put(full, _EPOCH.pack(epoch) + value), tx.get(full)],
                failure=[],
            ),
            f"create {key!r}",
        )
        if not ok:
            raise AlreadyExistsError(f"metadata key {key!r} already exists")
        return self._decode(key, responses[1][0][1])

    def put_if(self, key: str, value: bytes, expected_version: int, epoch: int) -> Versioned:
        full = self._kv_key(key)
        value = validate_meta_value(value)
        validate_version(expected_version)
        validate_epoch(epoch)
        current = self.get(key)
        if current is None:
            raise KeyDeletedError(f"metadata key {key!r} is deleted")
        if current.version != expected_version:
            raise VersionConflictError(
                f"metadata key {key!r} is at version {current.version}, not {expected_version}"
            )
        if current.epoch > epoch:
            raise EpochFencedError(
                f"metadata key {key!r} has epoch {current.epoch} > writer epoch {epoch}"
            )
        # mod_revision == expected pins the value, hence the epoch, checked above.
        tx = self._client.transactions
        ok, responses = self._run(
            self._client.transaction(
                compare=[tx.mod(full) == expected_version],
                success=[tx.put(full, _EPOCH.pack(epoch) + value), tx.get(full)],
                failure=[tx.get(full)],
            ),
            f"put_if {key!r}",
        )
        if ok:
            return self._decode(key, responses[1][0][1])
        if not responses[0]:
            raise KeyDeletedError(f"metadata key {key!r} is deleted")
        now = self._decode(key, responses[0][0][1])
        raise VersionConflictError(
            f"metadata key {key!r} is at version {now.version}, not {expected_version}"
        )

    def delete(
        self,
        key: str,
        expected_version: int | None = None,
        cleanup: tuple[str, bytes] | None = None,
    ) -> None:
        full = self._kv_key(key)
        tx = self._client.transactions
        success: list[Any] = [tx.delete(full)]
        if expected_version is not None:
            validate_version(expected_version)
            compare = [tx.mod(full) == expected_version]
        else:
            compare = [tx.create(full) > 0]
        if cleanup is not None:
            queue, payload = cleanup
            item_key = self._queue_prefix(queue) + uuid.uuid4().hex.encode()
            success.append(tx.put(item_key, validate_meta_value(payload)))
        ok, responses = self._run(
            self._client.transaction(compare=compare, success=success, failure=[tx.get(full)]),
            f"delete {key!r}",
        )
        if ok:
            return
        if not responses[0]:
            raise NotFoundError(f"metadata key {key!r} not found")
        now = self._decode(key, responses[0][0][1])
        raise VersionConflictError(
            f"metadata key {key!r} is at version {now.version}, not {expected_version}"
        )

    def list(self, prefix: str) -> builtins.list[Versioned]:
        full = self._kv_root + validate_meta_prefix(prefix).encode()
        found = self._run(self._client.get_prefix(full), f"list {prefix!r}")
        cut = len(self._kv_root)
        return [self._decode(bytes(kv.key)[cut:].decode(), kv) for kv in found]

    # --- cleanup queue -----------------------------------------------------------------
    def enqueue(self, queue: str, payload: bytes) -> CleanupItem:
        item_key = self._queue_prefix(queue) + uuid.uuid4().hex.encode()
        payload = validate_meta_value(payload)
        put = self._run(self._client.put(item_key, payload), f"enqueue {queue!r}")
        return CleanupItem(int(put.header.revision), queue, payload, item_key.hex())

    def pending(self, queue: str) -> builtins.list[CleanupItem]:
        found = self._run(
            self._client.get_prefix(
                self._queue_prefix(queue), sort_order="ascend", sort_target="create"
            ),
            f"pending {queue!r}",
        )
        with self._seen_lock:
            seen = self._seen_revision.get(queue, 0)
            self._seen_revision[queue] = max(seen, int(found.header.revision))
        return [
            CleanupItem(int(kv.create_revision), queue, bytes(kv.value), bytes(kv.key).hex())
            for kv in found
        ]

    def complete(self, item: CleanupItem) -> None:
        if item.ref:
            item_key = bytes.fromhex(item.ref)
            if not item_key.startswith(self._queue_prefix(item.queue)):
                raise PermanentError(f"cleanup item {item.item_id} is not in {item.queue!r}")
            self._run(self._client.delete(item_key), f"complete {item.queue!r}")
            return
        for found in self.pending(item.queue):  # an item built by hand: find it by id
            if found.item_id == item.item_id:
                self.complete(found)

    def wait_for_items(self, queue: str, timeout: float) -> bool:
        """Watches for puts after the last ``pending`` scan; events that happened while
        no watch ran are replayed from that revision (or, if compacted, we just wake)."""
        prefix = self._queue_prefix(queue)
        with self._seen_lock:
            seen = self._seen_revision.get(queue)
        if seen is None or timeout <= 0:
            items = self._run(self._client.get_prefix(prefix), f"wait {queue!r}")
            if any(int(kv.create_revision) > (seen or 0) for kv in items):
                return True
            if timeout <= 0:
                return False
            seen = int(items.header.revision)
        try:
            self._run(
                self._client.watch_once(
                    prefix,
                    timeout=timeout,
                    range_end=aetcd.utils.prefix_range_end(prefix),
                    start_revision=seen + 1,
                    kind=aetcd.EventKind.PUT,
                ),
                f"wait {queue!r}",
                wait=timeout,
            )
        except StorageError as exc:
            if isinstance(exc.__cause__, aetcd.WatchTimeoutError):
                return False
            if isinstance(exc.__cause__, aetcd.RevisionCompactedError):
                return True
            raise
        return True

    # --- leases ------------------------------------------------------------------------
    def acquire_lease(self, name: str, holder: str, ttl: float) -> Lease:
        holder_key = self._lease_root + validate_meta_key(name).encode()
        epoch_key = self._epoch_root + name.encode()
        holder_bytes = validate_meta_key(holder).encode()
        seconds = max(1, math.ceil(validate_ttl(ttl)))
        tx = self._client.transactions
        for _ in range(_ACQUIRE_ATTEMPTS):
            current = self._run(self._client.get(holder_key), f"lease {name!r}")
            if current is not None:
                raise LeaseHeldError(f"lease {name!r} is held by {bytes(current.value)!r}")
            stored = self._run(self._client.get(epoch_key), f"lease {name!r}")
            previous = int(stored.value) if stored is not None else 0
            seen_mod = int(stored.mod_revision) if stored is not None else 0
            grant = self._run(self._client.lease(seconds), f"lease {name!r}")
            epoch = previous + 1
            ok, _ = self._run(
                self._client.transaction(
                    compare=[tx.create(holder_key) == 0, tx.mod(epoch_key) == seen_mod],
                    success=[
                        tx.put(holder_key, holder_bytes, lease=grant.id),
                        tx.put(epoch_key, str(epoch).encode()),
                    ],
                    failure=[],
                ),
                f"lease {name!r}",
            )
            if ok:
                return Lease(name, holder, epoch, time.time() + grant.ttl, token=grant.id)
            self._revoke(grant.id)  # lost a race; loop to find out to whom
        raise TransientError(f"lease {name!r}: too much contention to acquire")

    def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        """Refreshes the etcd lease to the TTL granted at acquisition."""
        validate_ttl(ttl)
        reply = self._run(self._client.refresh_lease(lease.token), f"renew {lease.name!r}")
        if reply is None or int(reply.TTL) <= 0:
            raise LeaseLostError(f"lease {lease.name!r} epoch {lease.epoch} expired")
        current = self._run(
            self._client.get(self._lease_root + lease.name.encode()), f"renew {lease.name!r}"
        )
        if current is None or int(current.lease) != lease.token:
            raise LeaseLostError(f"lease {lease.name!r} epoch {lease.epoch} was taken over")
        return Lease(
            lease.name, lease.holder, lease.epoch, time.time() + int(reply.TTL), lease.token
        )

    def release_lease(self, lease: Lease) -> None:
        """Revoke the etcd lease (deleting the holder key); a no-op if already lost."""
        self._revoke(lease.token)

    def read_lease(self, name: str) -> Lease | None:
        """Holder and epoch read in one transaction (so they belong together); the
        expiry comes from the etcd lease's remaining TTL."""
        holder_key = self._lease_root + validate_meta_key(name).encode()
        epoch_key = self._epoch_root + name.encode()
        tx = self._client.transactions
        _, responses = self._run(
            self._client.transaction(
                compare=[], success=[tx.get(holder_key), tx.get(epoch_key)], failure=[]
            ),
            f"read lease {name!r}",
        )
        if not responses[0] or not responses[1]:
            return None
        holder = responses[0][0][1]
        epoch = int(bytes(responses[1][0][1].value))
        info = self._run(
            self._client.get_lease_info(int(holder.lease), keys=False), f"read lease {name!r}"
        )
        if info is None or int(info.TTL) < 0:  # -1: expired; 0: under a second left
            return None
        return Lease(
            name,
            bytes(holder.value).decode(),
            epoch,
            time.time() + int(info.TTL),
            int(holder.lease),
        )

    def _revoke(self, lease_id: int) -> None:
        try:
            self._run(self._client.revoke_lease(lease_id), "revoke lease")
        except PermanentError as exc:
            if _grpc_code(exc) != grpc.StatusCode.NOT_FOUND:
                raise

    # --- shutdown ------------------------------------------------------------------------
    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def close(self) -> None:
        if self._closed:
            return
        try:
            if hasattr(self, "_client"):
                self._run(self._client.close(), "close")
        except StorageError:
            pass  # closing a dead connection: nothing left to release on the server
        finally:
            self._closed = True
            self._stop_loop()
