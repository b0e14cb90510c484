"""Snapshot stores: where a retracted request's snapshot waits, so that another engine
instance (another process, another machine) can resume it.

The contract is [`SnapshotStore`][kvcache_core.stores.SnapshotStore] (bytes under string keys);
stores are plugins in the ``kvcache.stores`` entry-point group, found and validated by
[`discover_stores`][kvcache_core.stores.discover_stores] as pools are by ``discover``. The
built-in ones (in ``kvcache_plugins.stores``) are ``memory:``, ``dir:PATH``,
``redis://HOST:PORT/DB`` and ``redis+cluster://HOST:PORT`` (a sharded cluster). Importing
this package does not import torch.
"""

from .discovery import (
    AcceptedStore,
    StorePlugin,
    StoreRegistry,
    StoreRejection,
    discover_stores,
    open_store,
    store_drift,
)
from .redact import redact_url
from .snapshots import get_snapshot, put_snapshot
from .spec import STORE_METHODS, SnapshotStore, StoreFactory, StoreSpec

__all__ = [
    "STORE_METHODS",
    "AcceptedStore",
    "SnapshotStore",
    "StoreFactory",
    "StorePlugin",
    "StoreRegistry",
    "StoreRejection",
    "StoreSpec",
    "discover_stores",
    "get_snapshot",
    "open_store",
    "put_snapshot",
    "redact_url",
    "store_drift",
]
