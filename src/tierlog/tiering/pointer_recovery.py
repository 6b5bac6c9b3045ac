"""Rebuilding lost or undecodable manifest pointers from the root objects in the store.

Roots are immutable and named by a random uid, so the store holds every root that was
written and not yet deleted (superseded roots wait out the deletion grace). The newest
by (epoch, next offset) wins: a root is written only after every fragment it names was
uploaded, so even a root whose conditional put never happened names durable fragments.
Its fragments are checked (trailer present and consistent) before it is published.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierlog.errors import TierlogError
from tierlog.formats.manifest import decode_node
from tierlog.logs import get_logger
from tierlog.remote.catalog import Catalog, ManifestPointer, pointer_key
from tierlog.remote.errors import CorruptPointerError
from tierlog.remote.fragments import RemoteStream
from tierlog.remote.keys import metadata_prefix
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.remote.sealing import open_object
from tierlog.storage.errors import NotFoundError
from tierlog.storage.object_store import ObjectStore

log = get_logger(__name__)


@dataclass(frozen=True)
class PointerRecovery:
    incarnation: str
    status: str  # "ok", "recovered", "no-roots", "failed"
    root_uid: str | None = None
    next_offset: int | None = None
    detail: str = ""


def recover_pointers(
    catalog: Catalog, store: ObjectStore, prefix: str, *, dry_run: bool = False
) -> list[PointerRecovery]:
    """Check every catalogued stream's pointer; rebuild missing or corrupt ones."""
    out = []
    for record in catalog.list():
        incarnation = record.incarnation
        try:
            pointer = catalog.read_pointer(incarnation)
            if pointer is not None:
                out.append(PointerRecovery(incarnation, "ok", pointer.root_uid))
                continue
        except CorruptPointerError as exc:
            log.error("pointer_corrupt", stream=incarnation, error=str(exc))
        try:
            out.append(_rebuild(catalog, store, prefix, incarnation, dry_run))
        except TierlogError as exc:
            out.append(PointerRecovery(incarnation, "failed", detail=str(exc)))
    return out


def _rebuild(
    catalog: Catalog, store: ObjectStore, prefix: str, incarnation: str, dry_run: bool
) -> PointerRecovery:
    remote = RemoteStream(store, prefix, incarnation)
    best: tuple[tuple[int, int], str] | None = None
    for meta in store.list(metadata_prefix(prefix, incarnation)):
        name = meta.key.rsplit("/", 1)[-1]
        if not (name.startswith("root.") and name.endswith(".manifest")):
            continue
        uid = name[len("root.") : -len(".manifest")]
        try:
            root = bytes(open_object(meta.key, store.get(meta.key)))
            node = decode_node(root)
        except (TierlogError, NotFoundError):
            continue  # damaged or deleted under us: not a candidate
        rank = (node.header.epoch, node.header.next_offset)
        if (best is None or rank > best[0]) and _fragments_present(remote, root, prefix):
            best = (rank, uid)
    if best is None:
        return PointerRecovery(incarnation, "no-roots")
    (epoch, next_offset), uid = best
    if not dry_run:
        value = ManifestPointer(uid, epoch, 0).encode()
        key = pointer_key(incarnation)
        stored = catalog.meta.get(key)
        if stored is None:
            catalog.meta.create(key, value, epoch=epoch)
        else:
            catalog.meta.put_if(key, value, stored.version, max(epoch, stored.epoch))
        log.warning(
            "pointer_recovered",
            stream=incarnation,
            root=uid,
            epoch=epoch,
            next_offset=next_offset,
        )
    return PointerRecovery(incarnation, "recovered", uid, next_offset)


def _fragments_present(remote: RemoteStream, root: bytes, prefix: str) -> bool:
    """The root's last fragment exists and ends where the root says."""
    tree = ManifestTree.from_root(root, prefix)
    if tree.is_empty:
        return True
    try:
        loc = tree.locate_offset(tree.next_offset - 1, remote.load)
        fragment = remote.read_fragment(loc.entry.first_offset)
    except (TierlogError, NotFoundError):
        return False
    return fragment is not None and fragment.trailer.next_offset == tree.next_offset
