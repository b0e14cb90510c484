"""The kvcache contract: Protocols, the write-location record, snapshots, specs, history."""

from .allocator import MambaSlotAllocator, PagedAllocator, SWAAllocator, TokenAllocator
from .history import VERSIONS, ContractVersion
from .pool import (
    HiSparsePool,
    IndexerKeyPool,
    KVPool,
    LayerLike,
    MambaStatePool,
    MLAPool,
    OffloadablePool,
    SlidingWindowPool,
)
from .snapshot import KVSnapshot, PartLayout, expect_snapshot
from .spec import (
    BASE_PROTOCOLS,
    CAPABILITY_PROTOCOLS,
    CONTRACT_VERSION,
    Capability,
    PoolConfig,
    PoolFactory,
    PoolSpec,
)
from .writeloc import KVWriteLoc, unwrap_write_loc

__all__ = [
    "BASE_PROTOCOLS",
    "CAPABILITY_PROTOCOLS",
    "CONTRACT_VERSION",
    "VERSIONS",
    "Capability",
    "ContractVersion",
    "HiSparsePool",
    "IndexerKeyPool",
    "KVPool",
    "KVSnapshot",
    "KVWriteLoc",
    "LayerLike",
    "MLAPool",
    "MambaSlotAllocator",
    "MambaStatePool",
    "OffloadablePool",
    "PagedAllocator",
    "PartLayout",
    "PoolConfig",
    "PoolFactory",
    "PoolSpec",
    "SWAAllocator",
    "SlidingWindowPool",
    "TokenAllocator",
    "expect_snapshot",
    "unwrap_write_loc",
]
