"""kvcache: pluggable, conformance-checked KV-cache pools for LLM serving engines.

The public face: the contract (Protocols, ``KVWriteLoc``, ``KVSnapshot``, specs), the hook
markers for plugin authors, ``discover()`` for engines, and the input checks pools share.
"""

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
    UnknownPoolError,
    UnsupportedDtypeError,
)
from .hookspecs import hookimpl
from .storage import LayerRows, host_empty, storage_dtype
from .validation import check_rows, check_slots

__version__ = "0.1.0"

__all__ = [
    "CONTRACT_VERSION",
    "VERSIONS",
    "AllocatorError",
    "Capability",
    "DoubleFreeError",
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
    "PartLayout",
    "PluginRejectedError",
    "PoolConfig",
    "PoolSpec",
    "Registry",
    "Rejection",
    "SWAAllocator",
    "ShapeMismatchError",
    "SlidingWindowPool",
    "SnapshotMismatchError",
    "TokenAllocator",
    "UnknownPoolError",
    "UnsupportedDtypeError",
    "__version__",
    "check_rows",
    "check_slots",
    "discover",
    "expect_snapshot",
    "hookimpl",
    "host_empty",
    "storage_dtype",
    "unwrap_write_loc",
]
