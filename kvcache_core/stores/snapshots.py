"""Snapshots in and out of a store: the two calls an engine makes around a retraction.

``put_snapshot`` serialises before it touches the store, and ``get_snapshot`` checks every byte
before it returns, so a snapshot that reaches ``load_cpu_copy`` is exactly the one stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .spec import SnapshotStore

if TYPE_CHECKING:
    from ..contracts.snapshot import KVSnapshot

__all__ = ["get_snapshot", "put_snapshot"]


def put_snapshot(
    store: SnapshotStore, key: str, snapshot: KVSnapshot, *, ttl: float | None = None
) -> int:
    """Store ``snapshot``'s wire form under ``key``; return how many bytes were stored.

    :raises StoreUnavailableError: The store did not answer in time; nothing is read back
        from a failed put, so the caller keeps its snapshot and may retry or resume locally.
    """
    data = snapshot.to_bytes()
    store.put(key, data, ttl=ttl)
    return len(data)


def get_snapshot(
    store: SnapshotStore, key: str, *, max_bytes: int | None = None
) -> KVSnapshot | None:
    """The snapshot under ``key``, checked (format, checksum, structure), or None if absent.

    :param max_bytes: Refuse a larger value; the store refuses it before reading it (its
        ``get(key, max_bytes=...)``), so memory stays bounded whatever the store holds.
    :raises SnapshotMismatchError: The stored value is not an intact snapshot, or is larger
        than ``max_bytes`` ("oversized").
    :raises StoreUnavailableError: The store did not answer in time.
    :raises StoreError: Anything else the store refused.
    """
    from ..contracts.snapshot import KVSnapshot
    from ..errors import SnapshotMismatchError, StoreValueTooLargeError

    if max_bytes is None:
        data = store.get(key)
    else:
        try:
            data = store.get(key, max_bytes=max_bytes)
        except StoreValueTooLargeError as exc:
            raise SnapshotMismatchError(
                f"not a readable kvcache snapshot: oversized: {exc}"
            ) from None
    return None if data is None else KVSnapshot.from_bytes(data, max_bytes=max_bytes)
