"""kvcache: pluggable, conformance-checked KV-cache pools for LLM serving engines.

The public face: the contract (Protocols, ``KVWriteLoc``, ``KVSnapshot``, specs), the hook
markers for plugin authors, ``discover()`` for engines, and the helpers pools share (input
checks, per-layer storage, and the allocators the built-in pools use).

Names are imported on first use (PEP 562): ``kvcache_core.pytest_plugin`` is loaded by every
pytest run in an environment where kvcache is installed, and importing this package must not
cost those runs a torch import (about 2.7 s here) unless they ask for the conformance battery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from .allocation import (
        CompositeAllocator,
        DecodePlan,
        ExtendPlan,
        ForwardsOffload,
        FreeGroup,
        PagedSlotAllocator,
        SettledCall,
        SettleListener,
        TokenSlotAllocator,
        free_calls_one_by_one,
    )
    from .contracts import (
        CONTRACT_VERSION,
        VERSIONS,
        Capability,
        HiSparsePool,
        IndexerKeyPool,
        KVPool,
        KVSnapshot,
        KVWriteLoc,
        LayerLike,
        MambaSlotAllocator,
        MambaStatePool,
        MLAPool,
        OffloadablePool,
        PagedAllocator,
        PartLayout,
        PoolConfig,
        PoolSpec,
        SlidingWindowPool,
        SWAAllocator,
        TokenAllocator,
        expect_snapshot,
        unwrap_write_loc,
    )
    from .discovery import Registry, Rejection, discover
    from .errors import (
        AllocatorError,
        DoubleFreeError,
        InvalidLayerError,
        InvalidSlotError,
        KVCacheError,
        PluginRejectedError,
        ShapeMismatchError,
        SnapshotMismatchError,
        StoreError,
        StoreUnavailableError,
        StoreValueTooLargeError,
        UnknownPoolError,
        UnsupportedDtypeError,
    )
    from .hookspecs import hookimpl
    from .hostmem import host_cache_stats, release_host_cache, set_host_cache_limit
    from .quantized import QuantizedLayerRows
    from .storage import LayerRows, host_empty, storage_dtype
    from .stores import (
        SnapshotStore,
        StoreSpec,
        discover_stores,
        get_snapshot,
        open_store,
        put_snapshot,
    )
    from .validation import check_rows, check_slots

#: Public name -> the submodule that defines it.
_LAZY: dict[str, str] = {
    "CONTRACT_VERSION": ".contracts",
    "Capability": ".contracts",
    "HiSparsePool": ".contracts",
    "IndexerKeyPool": ".contracts",
    "KVPool": ".contracts",
    "KVSnapshot": ".contracts",
    "KVWriteLoc": ".contracts",
    "LayerLike": ".contracts",
    "MLAPool": ".contracts",
    "MambaSlotAllocator": ".contracts",
    "MambaStatePool": ".contracts",
    "OffloadablePool": ".contracts",
    "PagedAllocator": ".contracts",
    "PartLayout": ".contracts",
    "PoolConfig": ".contracts",
    "PoolSpec": ".contracts",
    "SWAAllocator": ".contracts",
    "SlidingWindowPool": ".contracts",
    "TokenAllocator": ".contracts",
    "VERSIONS": ".contracts",
    "expect_snapshot": ".contracts",
    "unwrap_write_loc": ".contracts",
    "CompositeAllocator": ".allocation",
    "DecodePlan": ".allocation",
    "ExtendPlan": ".allocation",
    "SettleListener": ".allocation",
    "SettledCall": ".allocation",
    "ForwardsOffload": ".allocation",
    "FreeGroup": ".allocation",
    "PagedSlotAllocator": ".allocation",
    "TokenSlotAllocator": ".allocation",
    "free_calls_one_by_one": ".allocation",
    "Registry": ".discovery",
    "Rejection": ".discovery",
    "discover": ".discovery",
    "AllocatorError": ".errors",
    "DoubleFreeError": ".errors",
    "InvalidLayerError": ".errors",
    "InvalidSlotError": ".errors",
    "KVCacheError": ".errors",
    "PluginRejectedError": ".errors",
    "ShapeMismatchError": ".errors",
    "SnapshotMismatchError": ".errors",
    "StoreError": ".errors",
    "StoreUnavailableError": ".errors",
    "StoreValueTooLargeError": ".errors",
    "UnknownPoolError": ".errors",
    "UnsupportedDtypeError": ".errors",
    "hookimpl": ".hookspecs",
    "host_cache_stats": ".hostmem",
    "release_host_cache": ".hostmem",
    "set_host_cache_limit": ".hostmem",
    "LayerRows": ".storage",
    "QuantizedLayerRows": ".quantized",
    "host_empty": ".storage",
    "storage_dtype": ".storage",
    "SnapshotStore": ".stores",
    "StoreSpec": ".stores",
    "discover_stores": ".stores",
    "get_snapshot": ".stores",
    "open_store": ".stores",
    "put_snapshot": ".stores",
    "check_rows": ".validation",
    "check_slots": ".validation",
}


__getattr__, __dir__ = _lazy_exports(globals(), _LAZY)


__version__ = "0.1.0"
"""This kvcache release (the distribution's version; the contract has its own,
[`CONTRACT_VERSION`][kvcache_core.CONTRACT_VERSION])."""

__all__ = [
    "CONTRACT_VERSION",
    "VERSIONS",
    "AllocatorError",
    "Capability",
    "CompositeAllocator",
    "DecodePlan",
    "DoubleFreeError",
    "ExtendPlan",
    "ForwardsOffload",
    "FreeGroup",
    "HiSparsePool",
    "IndexerKeyPool",
    "InvalidLayerError",
    "InvalidSlotError",
    "KVCacheError",
    "KVPool",
    "KVSnapshot",
    "KVWriteLoc",
    "LayerLike",
    "LayerRows",
    "MLAPool",
    "MambaSlotAllocator",
    "MambaStatePool",
    "OffloadablePool",
    "PagedAllocator",
    "PagedSlotAllocator",
    "PartLayout",
    "PluginRejectedError",
    "PoolConfig",
    "PoolSpec",
    "QuantizedLayerRows",
    "Registry",
    "Rejection",
    "SWAAllocator",
    "SettleListener",
    "SettledCall",
    "ShapeMismatchError",
    "SlidingWindowPool",
    "SnapshotMismatchError",
    "SnapshotStore",
    "StoreError",
    "StoreSpec",
    "StoreUnavailableError",
    "StoreValueTooLargeError",
    "TokenAllocator",
    "TokenSlotAllocator",
    "UnknownPoolError",
    "UnsupportedDtypeError",
    "__version__",
    "check_rows",
    "check_slots",
    "discover",
    "discover_stores",
    "expect_snapshot",
    "free_calls_one_by_one",
    "get_snapshot",
    "hookimpl",
    "host_cache_stats",
    "host_empty",
    "open_store",
    "put_snapshot",
    "release_host_cache",
    "set_host_cache_limit",
    "storage_dtype",
    "unwrap_write_loc",
]
