"""The embedded MetaStore: one SQLite file in WAL mode.

Every conditional operation is one ``BEGIN IMMEDIATE`` transaction, so concurrent writers
in other threads and processes are serialized by SQLite's write lock. Versions come from
one global revision counter (like etcd's revisions), so a key's version strictly grows
and is never reused, even after delete and re-create.
"""

from __future__ import annotations

import builtins
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tierlog.errors import ConfigError
from tierlog.storage.errors import (
    AlreadyExistsError,
    EpochFencedError,
    KeyDeletedError,
    LeaseHeldError,
    LeaseLostError,
    NotFoundError,
    PermanentError,
    TransientError,
    VersionConflictError,
)
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

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS counter (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO counter (name, value) VALUES ('revision', 0)",
    "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL,"
    " version INTEGER NOT NULL, epoch INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS cleanup (item_id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " queue TEXT NOT NULL, payload BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS cleanup_by_queue ON cleanup (queue, item_id)",
    # A lease row outlives its holders so the next acquisition continues its epoch.
    "CREATE TABLE IF NOT EXISTS lease (name TEXT PRIMARY KEY, holder TEXT NOT NULL,"
    " epoch INTEGER NOT NULL, expires_at REAL NOT NULL)",
)

DEFAULT_BUSY_TIMEOUT_S = 30.0
CROSS_PROCESS_POLL_S = 0.1


def _prefix_end(prefix: str) -> str | None:
    """Smallest string above every string starting with ``prefix`` (None: no bound).
    SQLite's BINARY collation compares UTF-8 bytes, which orders like code points."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < 0x10FFFF:
            bumped = last + 1 if last + 1 != 0xD800 else 0xE000  # skip surrogates
            return "".join(chars) + chr(bumped)
    return None


class SqliteMetaStore(MetaStore):
    """MetaStore in one SQLite file; safe for threads (one connection behind a lock)
    and for processes (SQLite's file locks)."""

    def __init__(self, path: str, busy_timeout: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        if not os.path.isabs(path):
            raise ConfigError(f"SQLite metadata store path {path!r} must be absolute")
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            raise ConfigError(f"SQLite metadata store directory {directory!r} does not exist")
        self.path = path
        self._lock = threading.Lock()
        self._enqueued = threading.Condition()
        self._enqueue_count = 0  # bumped on every local enqueue; guarded by _enqueued
        self._seen: dict[str, int] = {}  # queue -> largest item_id returned by pending()
        self._closed = False
        with self._guard():
            self._conn = sqlite3.connect(
                path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
            try:
                mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise PermanentError(f"{path}: SQLite refused WAL mode (got {mode!r})")
                self._conn.execute("PRAGMA synchronous=FULL")
                self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
                with self._write() as conn:
                    for statement in _SCHEMA:
                        conn.execute(statement)
            except BaseException:
                self._conn.close()
                raise

    # --- plumbing ------------------------------------------------------------------
    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Translate sqlite3 errors to typed storage errors."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if "locked" in text or "busy" in text:
                raise TransientError(f"{self.path}: {exc}") from exc
            raise PermanentError(f"{self.path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise PermanentError(f"{self.path}: {exc}") from exc

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._guard(), self._lock:
            if self._closed:
                raise PermanentError(f"{self.path}: metadata store is closed")
            yield self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on error.
        Must be entered with ``_lock`` held (via ``_read``) or during ``__init__``."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._read() as conn, self._write():
            yield conn

    @staticmethod
    def _next_revision(conn: sqlite3.Connection) -> int:
        row = conn.execute(
            "UPDATE counter SET value = value + 1 WHERE name = 'revision' RETURNING value"
        ).fetchone()
        return int(row[0])

    def _notify_enqueued(self) -> None:
        with self._enqueued:
            self._enqueue_count += 1
            self._enqueued.notify_all()

    # --- keys ------------------------------------------------------------------------
    def get(self, key: str) -> Versioned | None:
        validate_meta_key(key)
        with self._read() as conn:
            row = conn.execute(
                "SELECT value, version, epoch FROM kv WHERE key = ?", (key,)
            ).fetchone()
        return None if row is None else Versioned(key, bytes(row[0]), row[1], row[2])

    def create(self, key: str, value: bytes, epoch: int = 0) -> Versioned:
        validate_meta_key(key)
        value = validate_meta_value(value)
        validate_epoch(epoch)
        with self._transaction() as conn:
            if conn.execute("SELECT 1 FROM kv WHERE key = ?", (key,)).fetchone():
                raise AlreadyExistsError(f"metadata key {key!r} already exists")
            version = self._next_revision(conn)
            conn.execute(
                "INSERT INTO kv (key, value, version, epoch) VALUES (?, ?, ?, ?)",
                (key, value, version, epoch),
            )
        return Versioned(key, value, version, epoch)

    def put_if(self, key: str, value: bytes, expected_version: int, epoch: int) -> Versioned:
        validate_meta_key(key)
        value = validate_meta_value(value)
        validate_version(expected_version)
        validate_epoch(epoch)
        with self._transaction() as conn:
            row = conn.execute("SELECT version, epoch FROM kv WHERE key = ?", (key,)).fetchone()
            if row is None:
                raise KeyDeletedError(f"metadata key {key!r} is deleted")
            stored_version, stored_epoch = row
            if stored_version != expected_version:
                raise VersionConflictError(
                    f"metadata key {key!r} is at version {stored_version}, not {expected_version}"
                )
            if stored_epoch > epoch:
                raise EpochFencedError(
                    f"metadata key {key!r} has epoch {stored_epoch} > writer epoch {epoch}"
                )
            version = self._next_revision(conn)
            conn.execute(
                "UPDATE kv SET value = ?, version = ?, epoch = ? WHERE key = ?",
                (value, version, epoch, key),
            )
        return Versioned(key, value, version, epoch)

    def delete(
        self,
        key: str,
        expected_version: int | None = None,
        cleanup: tuple[str, bytes] | None = None,
    ) -> None:
        validate_meta_key(key)
        if expected_version is not None:
            validate_version(expected_version)
        if cleanup is not None:
            queue, payload = cleanup
            validate_meta_key(queue)
            payload = validate_meta_value(payload)
        with self._transaction() as conn:
            row = conn.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
            if row is None:
                raise NotFoundError(f"metadata key {key!r} not found")
            if expected_version is not None and row[0] != expected_version:
                raise VersionConflictError(
                    f"metadata key {key!r} is at version {row[0]}, not {expected_version}"
                )
            conn.execute("DELETE FROM kv WHERE key = ?", (key,))
            self._next_revision(conn)
            if cleanup is not None:
                conn.execute("INSERT INTO cleanup (queue, payload) VALUES (?, ?)", (queue, payload))
        if cleanup is not None:
            self._notify_enqueued()

    def list(self, prefix: str) -> builtins.list[Versioned]:
        validate_meta_prefix(prefix)
        end = _prefix_end(prefix)
        with self._read() as conn:
            rows = conn.execute(
                "SELECT key, value, version, epoch FROM kv WHERE key >= ?"
                " AND (? IS NULL OR key < ?) ORDER BY key",
                (prefix, end, end),
            ).fetchall()
        return [Versioned(k, bytes(v), ver, ep) for k, v, ver, ep in rows]

    # --- cleanup queue -----------------------------------------------------------------
    def enqueue(self, queue: str, payload: bytes) -> CleanupItem:
        validate_meta_key(queue)
        payload = validate_meta_value(payload)
        with self._transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO cleanup (queue, payload) VALUES (?, ?)", (queue, payload)
            )
            item_id = cursor.lastrowid
        self._notify_enqueued()
        assert item_id is not None
        return CleanupItem(item_id, queue, payload)

    def pending(self, queue: str) -> builtins.list[CleanupItem]:
        validate_meta_key(queue)
        with self._read() as conn:
            rows = conn.execute(
                "SELECT item_id, payload FROM cleanup WHERE queue = ? ORDER BY item_id", (queue,)
            ).fetchall()
            if rows:
                self._seen[queue] = max(self._seen.get(queue, 0), rows[-1][0])
        return [CleanupItem(item_id, queue, bytes(payload)) for item_id, payload in rows]

    def complete(self, item: CleanupItem) -> None:
        with self._transaction() as conn:
            conn.execute(
                "DELETE FROM cleanup WHERE item_id = ? AND queue = ?", (item.item_id, item.queue)
            )

    def _has_items_after(self, queue: str, item_id: int) -> bool:
        with self._read() as conn:
            row = conn.execute(
                "SELECT 1 FROM cleanup WHERE queue = ? AND item_id > ? LIMIT 1", (queue, item_id)
            ).fetchone()
        return row is not None

    def wait_for_items(self, queue: str, timeout: float) -> bool:
        """Wakes at once on enqueues by this store; polls the file for other processes."""
        validate_meta_key(queue)
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            with self._enqueued:
                count = self._enqueue_count
            if self._has_items_after(queue, self._seen.get(queue, 0)):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._enqueued:
                if self._enqueue_count == count:
                    self._enqueued.wait(min(remaining, CROSS_PROCESS_POLL_S))

    # --- leases ------------------------------------------------------------------------
    def acquire_lease(self, name: str, holder: str, ttl: float) -> Lease:
        validate_meta_key(name)
        validate_meta_key(holder)
        ttl = validate_ttl(ttl)
        with self._transaction() as conn:
            now = time.time()
            row = conn.execute(
                "SELECT holder, epoch, expires_at FROM lease WHERE name = ?", (name,)
            ).fetchone()
            if row is not None and row[0] and row[2] > now:
                raise LeaseHeldError(f"lease {name!r} is held by {row[0]!r} (epoch {row[1]})")
            epoch = (row[1] if row is not None else 0) + 1
            expires_at = now + ttl
            conn.execute(
                "INSERT INTO lease (name, holder, epoch, expires_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,"
                " epoch = excluded.epoch, expires_at = excluded.expires_at",
                (name, holder, epoch, expires_at),
            )
        return Lease(name, holder, epoch, expires_at)

    def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        ttl = validate_ttl(ttl)
        with self._transaction() as conn:
            now = time.time()
            cursor = conn.execute(
                "UPDATE lease SET expires_at = ? WHERE name = ? AND holder = ? AND epoch = ?"
                " AND expires_at > ?",
                (now + ttl, lease.name, lease.holder, lease.epoch, now),
            )
            if cursor.rowcount != 1:
                raise LeaseLostError(
                    f"lease {lease.name!r} epoch {lease.epoch} expired or was taken over"
                )
        return Lease(lease.name, lease.holder, lease.epoch, now + ttl)

    def release_lease(self, lease: Lease) -> None:
        """Give the lease up now; a no-op if it was already lost."""
        with self._transaction() as conn:
            conn.execute(
                "UPDATE lease SET holder = '', expires_at = 0"
                " WHERE name = ? AND holder = ? AND epoch = ?",
                (lease.name, lease.holder, lease.epoch),
            )

    def read_lease(self, name: str) -> Lease | None:
        validate_meta_key(name)
        with self._read() as conn:
            row = conn.execute(
                "SELECT holder, epoch, expires_at FROM lease WHERE name = ?", (name,)
            ).fetchone()
        if row is None or not row[0] or row[2] <= time.time():
            return None
        return Lease(name, row[0], row[1], row[2])

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
