"""The filesystem ObjectStore: the embedded default, with the same contract as S3.

Layout under the root: every key segment but the last is a directory ``<segment>.d`` and the
last is a file ``<segment>.o``, so ``a`` and ``a/b`` can both exist, as on S3. Writes are staged
in ``<root>/staging`` (a name without either suffix, so it is never part of the namespace) and
become visible in one step: ``rename`` for overwrites, ``link`` for create-only puts (link fails
if the name exists, and the linked file was fully written and fsynced first, so no reader ever
sees a partial object). Directories are fsynced after every change to their entries.

User metadata is a JSON extended attribute (``user.tierlog.metadata``) set on the staged file
before it is published, so an object and its metadata appear together. A multipart upload is a
staging directory ``mpu-<hex>`` (its upload id) holding the parts and ``upload.json`` (key,
metadata), so uploads left by a crash can be listed and aborted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from tierlog.storage.errors import (
    AlreadyExistsError,
    InvalidKeyError,
    InvalidRangeError,
    NotFoundError,
    PermanentError,
    StorageError,
    TransientError,
    UnsupportedBackendError,
)
from tierlog.storage.object_store import (
    MIN_PART_SIZE,
    Buffer,
    MultipartUpload,
    ObjectMeta,
    ObjectStore,
    PendingUpload,
    clamp_range,
    short_key,
    validate_key,
    validate_metadata,
    validate_part,
)

OBJECT_SUFFIX = ".o"
DIR_SUFFIX = ".d"
STAGING = "staging"
_READ_CHUNK = 16 * 1024 * 1024
STALE_STAGING_S = 24 * 3600.0  # far longer than any upload; other processes may share the root
METADATA_XATTR = "user.tierlog.metadata"
UPLOAD_FILE = "upload.json"
_UPLOAD_ID = re.compile(r"mpu-[0-9a-f]{32}")


def _set_metadata(fd: int, metadata: dict[str, str]) -> None:
    if not metadata:
        return
    try:
        os.setxattr(fd, METADATA_XATTR, json.dumps(metadata, sort_keys=True).encode())
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise UnsupportedBackendError(
                "the filesystem object store keeps user metadata in extended attributes, "
                "which this filesystem does not support"
            ) from exc
        raise


def _get_metadata(path: str) -> dict[str, str]:
    try:
        raw = os.getxattr(path, METADATA_XATTR)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return {}
        raise
    value: dict[str, str] = json.loads(raw)
    return value


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: Buffer) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _storage_error(exc: OSError, what: str) -> StorageError:
    """Map an OS error to the typed error a caller can act on."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR):
        return NotFoundError(f"{what}: not found")
    if exc.errno == errno.ENAMETOOLONG:
        return InvalidKeyError(f"{what}: a key segment is too long for the filesystem")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN, errno.EINTR):
        return TransientError(f"{what}: {exc.strerror}", kind="io")
    # EACCES, EROFS, ...: an operator must act; tiering retries with backoff meanwhile
    return PermanentError(f"{what}: {exc.strerror or exc}")


class FsObjectStore(ObjectStore):
    """Objects as files under ``root`` (created if missing)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.realpath(root)
        self.staging = os.path.join(self.root, STAGING)
        os.makedirs(self.staging, exist_ok=True)
        self._remove_stale_staging()

    def _remove_stale_staging(self) -> None:
        """Temp files of puts that crashed mid-way are never visible; reclaim old ones."""
        cutoff = time.time() - STALE_STAGING_S
        with os.scandir(self.staging) as it:
            for entry in it:
                try:
                    if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
                except FileNotFoundError:
                    continue

    def __repr__(self) -> str:
        return f"FsObjectStore({self.root!r})"

    # -- key <-> path -----------------------------------------------------------------------

    def _path(self, key: str) -> str:
        """The file of ``key``; refuses anything that would resolve outside the root."""
        parts = validate_key(key).split("/")
        rel = [p + DIR_SUFFIX for p in parts[:-1]] + [parts[-1] + OBJECT_SUFFIX]
        path = os.path.join(self.root, *rel)
        resolved = os.path.realpath(path)
        if resolved != path and not resolved.startswith(self.root + os.sep):
            raise InvalidKeyError(f"object key {short_key(key)} resolves outside the store root")
        return path

    def _dir_path(self, prefix_dirs: list[str]) -> str:
        return os.path.join(self.root, *(p + DIR_SUFFIX for p in prefix_dirs))

    def _stage(self, data: Buffer, key: str, metadata: dict[str, str] | None = None) -> str:
        """A fully written, fsynced temp file (with its user metadata) in the staging
        directory. A full disk or an I/O error is a typed ``TransientError`` (never a raw
        ``OSError``): callers retry it."""
        path = os.path.join(self.staging, f"put-{uuid.uuid4().hex}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                _write_all(fd, data)
                _set_metadata(fd, metadata or {})
                os.fsync(fd)
            except BaseException:
                os.close(fd)
                os.unlink(path)
                raise
            os.close(fd)
        except OSError as exc:
            error = _storage_error(exc, f"put {short_key(key)} (staging)")
            if isinstance(error, NotFoundError):  # the staging directory itself is gone
                error = TransientError(f"put {short_key(key)}: no staging directory", kind="io")
            raise error from exc
        return path

    def _make_parents(self, path: str) -> None:
        """Create the parent directories of ``path``, fsyncing each new directory's parent."""
        parent = os.path.dirname(path)
        if os.path.isdir(parent):
            return
        missing: list[str] = []
        d = parent
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            _fsync_dir(os.path.dirname(d))

    def _publish(self, temp: str, path: str, create_only: bool, key: str) -> None:
        """Make a staged file visible at ``path`` (retrying if a racing delete removes dirs)."""
        try:
            for _ in range(10):
                self._make_parents(path)
                try:
                    if create_only:
                        os.link(temp, path)
                    else:
                        os.rename(temp, path)
                except FileNotFoundError:
                    continue  # a concurrent delete pruned an empty parent directory
                except FileExistsError:
                    raise AlreadyExistsError(f"object {short_key(key)} already exists") from None
                _fsync_dir(os.path.dirname(path))
                return
            raise TransientError(f"put {short_key(key)}: parent directory keeps disappearing")
        except OSError as exc:
            raise _storage_error(exc, f"put {short_key(key)}") from exc
        finally:
            if create_only or os.path.exists(temp):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp)

    @staticmethod
    def _meta(key: str, st: os.stat_result) -> ObjectMeta:
        etag = f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"
        return ObjectMeta(key, st.st_size, etag, st.st_mtime_ns / 1e9)

    # -- ObjectStore ------------------------------------------------------------------------

    def put(
        self, key: str, data: Buffer, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectMeta:
        path = self._path(key)
        temp = self._stage(data, key, validate_metadata(metadata))
        self._publish(temp, path, create_only=False, key=key)
        return self.head(key)

    def put_if_absent(
        self, key: str, data: Buffer, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectMeta:
        path = self._path(key)
        checked = validate_metadata(metadata)
        if os.path.exists(path):  # cheap early exit; link(2) below is the real check
            raise AlreadyExistsError(f"object {short_key(key)} already exists")
        temp = self._stage(data, key, checked)
        self._publish(temp, path, create_only=True, key=key)
        return self.head(key)

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise _storage_error(exc, f"get {short_key(key)}") from exc
        try:
            lo, hi = clamp_range(start, end, os.fstat(fd).st_size)
            return self._pread(fd, lo, hi)
        finally:
            os.close(fd)

    def get_suffix(self, key: str, length: int) -> bytes:
        if length < 0:
            raise InvalidRangeError(f"negative suffix length {length}")
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise _storage_error(exc, f"get {short_key(key)}") from exc
        try:
            size = os.fstat(fd).st_size
            return self._pread(fd, max(0, size - length), size)
        finally:
            os.close(fd)

    @staticmethod
    def _pread(fd: int, lo: int, hi: int) -> bytes:
        first = os.pread(fd, hi - lo, lo)
        if len(first) == hi - lo:
            return first
        pieces = [first]  # short read: keep going (the file is immutable once visible)
        pos = lo + len(first)
        while pos < hi:
            piece = os.pread(fd, min(hi - pos, _READ_CHUNK), pos)
            if not piece:
                break
            pieces.append(piece)
            pos += len(piece)
        return b"".join(pieces)

    def head(self, key: str) -> ObjectMeta:
        path = self._path(key)
        try:
            st = os.stat(path)
            metadata = _get_metadata(path)
        except OSError as exc:
            raise _storage_error(exc, f"head {short_key(key)}") from exc
        meta = self._meta(key, st)
        return ObjectMeta(meta.key, meta.size, meta.etag, meta.last_modified, metadata)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectMeta]:
        """Walk only the directories that can hold matching keys, each sorted, yielding keys in
        lexicographic order (a directory ``d`` sorts as ``d/``, which orders it exactly where
        its keys fall among its sibling files)."""
        if prefix:
            validate_key(prefix.rstrip("/") or "x")
        dirs = prefix.split("/")[:-1]
        yield from self._walk(
            self._dir_path(dirs), "".join(d + "/" for d in dirs), prefix, start_after
        )

    def _walk(
        self, directory: str, key_prefix: str, prefix: str, start_after: str | None
    ) -> Iterator[ObjectMeta]:
        try:
            with os.scandir(directory) as it:
                entries = []
                for entry in it:
                    name = entry.name
                    if name.endswith(OBJECT_SUFFIX):
                        entries.append((key_prefix + name[: -len(OBJECT_SUFFIX)], False, entry))
                    elif name.endswith(DIR_SUFFIX):
                        sub = key_prefix + name[: -len(DIR_SUFFIX)] + "/"
                        entries.append((sub, True, entry))
        except (FileNotFoundError, NotADirectoryError):
            return
        entries.sort(key=lambda e: e[0])
        for key, is_dir, entry in entries:
            if is_dir:
                # skip directories that cannot hold a key matching prefix or after start_after
                if not (key.startswith(prefix) or prefix.startswith(key)):
                    continue
                if (
                    start_after is not None
                    and key < start_after
                    and not start_after.startswith(key)
                ):
                    continue
                yield from self._walk(entry.path, key, prefix, start_after)
                continue
            if not key.startswith(prefix) or (start_after is not None and key <= start_after):
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue  # deleted while listing
            yield self._meta(key, st)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _storage_error(exc, f"delete {short_key(key)}") from exc
        parent = os.path.dirname(path)
        _fsync_dir(parent)
        self._prune_empty_dirs(parent)

    def _prune_empty_dirs(self, directory: str) -> None:
        """Remove now-empty key directories up to the root (puts retry if they race this)."""
        while directory != self.root and directory.startswith(self.root + os.sep):
            try:
                os.rmdir(directory)
            except OSError:
                return
            directory = os.path.dirname(directory)
            _fsync_dir(directory)

    def create_multipart(
        self, key: str, *, metadata: Mapping[str, str] | None = None
    ) -> MultipartUpload:
        return FsMultipartUpload(self, key, self._path(key), validate_metadata(metadata))

    def list_multipart_uploads(self, prefix: str = "") -> Iterator[PendingUpload]:
        found: list[PendingUpload] = []
        with os.scandir(self.staging) as it:
            for entry in it:
                if not _UPLOAD_ID.fullmatch(entry.name):
                    continue
                try:
                    with open(os.path.join(entry.path, UPLOAD_FILE), "rb") as f:
                        key = json.load(f)["key"]
                    initiated = entry.stat().st_mtime
                except (FileNotFoundError, NotADirectoryError, ValueError, KeyError):
                    continue  # completing, aborting, or torn at creation (never had a part)
                if key.startswith(prefix):
                    found.append(PendingUpload(key, entry.name, initiated))
        found.sort(key=lambda u: (u.key, u.upload_id))
        return iter(found)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        validate_key(key)
        if not _UPLOAD_ID.fullmatch(upload_id):
            return  # never an id of this store: nothing to abort
        directory = os.path.join(self.staging, upload_id)
        try:
            with open(os.path.join(directory, UPLOAD_FILE), "rb") as f:
                if json.load(f)["key"] != key:
                    return
        except (FileNotFoundError, NotADirectoryError, ValueError, KeyError):
            pass  # torn at creation: remove what is there
        shutil.rmtree(directory, ignore_errors=True)


class FsMultipartUpload(MultipartUpload):
    """Parts are staged as files in a private staging directory; ``complete`` concatenates
    them into one staged file and renames it into place."""

    def __init__(self, store: FsObjectStore, key: str, path: str, metadata: dict[str, str]) -> None:
        self.key = key
        self._store = store
        self._path = path
        self._metadata = metadata
        self.upload_id = f"mpu-{uuid.uuid4().hex}"
        self._dir = os.path.join(store.staging, self.upload_id)
        os.mkdir(self._dir)
        description = json.dumps({"key": key, "metadata": metadata}).encode()
        temp = store._stage(description, key)
        os.replace(temp, os.path.join(self._dir, UPLOAD_FILE))

    def _part_path(self, part_number: int) -> str:
        return os.path.join(self._dir, f"{part_number:05d}")

    def _check_open(self) -> None:
        if not os.path.isdir(self._dir):
            raise PermanentError(
                f"multipart upload of {short_key(self.key)} was completed or aborted"
            )

    def put_part(self, part_number: int, data: Buffer) -> None:
        validate_part(part_number, memoryview(data).nbytes)
        self._check_open()
        temp = self._store._stage(data, self.key)
        os.replace(temp, self._part_path(part_number))

    def complete(self) -> ObjectMeta:
        self._check_open()
        names = sorted(p for p in Path(self._dir).iterdir() if p.name.isdigit())
        if not names:
            raise InvalidRangeError(f"multipart upload of {short_key(self.key)} has no parts")
        for part in names[:-1]:
            if part.stat().st_size < MIN_PART_SIZE:
                raise InvalidRangeError(
                    f"part {int(part.name)} of {short_key(self.key)} is under {MIN_PART_SIZE} bytes"
                )
        joined = os.path.join(self._store.staging, f"put-{uuid.uuid4().hex}")
        with open(joined, "wb") as out:
            for part in names:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, out, _READ_CHUNK)
            out.flush()
            _set_metadata(out.fileno(), self._metadata)
            os.fsync(out.fileno())
        self._store._publish(joined, self._path, create_only=False, key=self.key)
        shutil.rmtree(self._dir, ignore_errors=True)
        return self._store.head(self.key)

    def abort(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
