"""The snapshot-store contract: the [`SnapshotStore`][kvcache_core.stores.SnapshotStore]
Protocol and the [`StoreSpec`][kvcache_core.stores.StoreSpec] a plugin returns.

A store holds bytes under string keys, not snapshots: the wire format
([`KVSnapshot.to_bytes`][kvcache_core.KVSnapshot.to_bytes]) carries its own version and
checksum, so a store needs no knowledge of tensors and every store gets the same corruption
checks for free. Nothing here imports torch: a process that only moves bytes (a store's worker,
a test's writer) stays light.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["STORE_METHODS", "SnapshotStore", "StoreFactory", "StoreSpec"]


@runtime_checkable
class SnapshotStore(Protocol):
    """Where retracted snapshots wait to be resumed, possibly by another engine instance.

    Keys are strings; values are bytes (normally a snapshot's wire form). ``put`` is atomic:
    a reader sees the old value, the new value or nothing, never a part of one, even when the
    writer dies mid-call, and a value it acknowledged is removed only by a later ``put`` or
    ``delete`` of its key or by its ttl, never by a reader. Errors:
    [`StoreUnavailableError`][kvcache_core.StoreUnavailableError] when the backend does not
    answer within the store's timeout (a bound on the whole call, never an endless wait),
    [`StoreError`][kvcache_core.StoreError] for anything else the store refuses; no other
    exception type. The full contract, and the test that holds each promise, is in
    docs/stores.md ("The store contract").
    """

    def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        """Store ``value`` under ``key``, replacing any value; expire it after ``ttl``
        seconds when given (a store without expiry raises ``StoreError`` for a ``ttl``)."""
        ...

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes | None:
        """The value under ``key``, or None when there is none (or it expired).

        With ``max_bytes``, a larger value raises
        [`StoreValueTooLargeError`][kvcache_core.StoreValueTooLargeError] before it is in this
        process's memory (the store asks for the size first, or reads at most
        ``max_bytes + 1`` bytes).
        """
        ...

    def delete(self, key: str) -> bool:
        """Remove ``key``; True when it held a value."""
        ...

    def exists(self, key: str) -> bool:
        """Whether ``key`` holds a value now."""
        ...

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        """``put`` of every item, in one round trip where the backend allows."""
        ...

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """``get`` of every key, in order, in one round trip where the backend allows."""
        ...

    def delete_many(self, keys: Sequence[str]) -> int:
        """``delete`` of every key; how many held a value."""
        ...

    def close(self) -> None:
        """Release connections or handles; the store is not used afterwards."""
        ...


STORE_METHODS: tuple[str, ...] = (
    "put",
    "get",
    "delete",
    "exists",
    "put_many",
    "get_many",
    "delete_many",
    "close",
)
"""The [`SnapshotStore`][kvcache_core.stores.SnapshotStore] methods, in the order discovery
checks a plugin's ``store_class`` for them: one list, so the Protocol, discovery's drift check
and its rejection message cannot disagree about what a store must implement."""

StoreFactory = Callable[[str], SnapshotStore]
"""Builds a store from its URL (``memory:``, ``dir:/var/kv``, ``redis://host:6379/0``)."""


@dataclass(frozen=True)
class StoreSpec:
    """What a store plugin's ``kvcache_store_specs()`` hook returns, one per store kind.

    :param name: The store's name (``memory``, ``dir``, ``redis``), unique among plugins.
    :param schemes: URL schemes it opens (``redis`` and ``rediss``); unique among plugins.
    :param factory: Builds an open store from a URL of one of those schemes.
    :param store_class: The class ``factory`` returns: discovery checks its methods against
        [`SnapshotStore`][kvcache_core.stores.SnapshotStore] before the store is accepted.
    :param description: One line for ``kvcache list`` and the docs.
    :param shared: True when two processes opening the same URL see the same keys (the
        battery's multi-process checks run only then; the in-process store is not shared).
    :param supports_ttl: Whether ``put(..., ttl=...)`` expires values.
    :param example_url: A URL the battery may open when none is given (None: a URL is needed,
        e.g. a server's address).
    """

    name: str
    """The store's name (``memory``, ``dir``, ``redis``), unique among plugins: the key of
    [`StoreRegistry.accepted`][kvcache_core.stores.StoreRegistry.accepted] and what reports
    call the store."""
    schemes: tuple[str, ...]
    """URL schemes it opens (``redis`` and ``rediss``), unique among plugins: how
    [`StoreRegistry.open`][kvcache_core.stores.StoreRegistry.open] picks this store for a URL."""
    factory: StoreFactory
    """Builds an open store from a URL of one of those schemes."""
    store_class: type
    """The class ``factory`` returns: discovery checks its methods against
    [`SnapshotStore`][kvcache_core.stores.SnapshotStore] before the store is accepted, so drift
    is caught at load time rather than on the first retraction."""
    description: str = ""
    """One line for ``kvcache list`` and the docs."""
    shared: bool = True
    """True when two processes opening the same URL see the same keys: the battery's
    concurrency checks then use separate processes, otherwise threads sharing one store (the
    in-process ``memory:`` store is not shared)."""
    supports_ttl: bool = True
    """Whether ``put(..., ttl=...)`` expires values; the battery skips its expiry checks
    otherwise, and such a store raises ``StoreError`` for a ``ttl``."""
    example_url: str | None = None
    """A URL the battery may open when none is given; None when a URL is needed (e.g. a
    server's address)."""
