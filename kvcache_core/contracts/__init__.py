"""The kvcache contract: Protocols, the write-location record, snapshots, specs, history.

Names are imported on first use (PEP 562), as in the top-level package: the Protocols and
specs need torch, while the history and the neutral signatures (``contracts.history``,
``contracts.signature``) do not, and source-only commands (``kvcache drift``,
``kvcache check --level source``) import those without paying for torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from .allocator import MambaSlotAllocator, PagedAllocator, SWAAllocator, TokenAllocator
    from .history import CONTRACT_VERSION, VERSIONS, ContractVersion
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
        Capability,
        PoolConfig,
        PoolFactory,
        PoolSpec,
    )
    from .writeloc import KVWriteLoc, unwrap_write_loc

#: Public name -> the submodule that defines it.
_LAZY: dict[str, str] = {
    "MambaSlotAllocator": ".allocator",
    "PagedAllocator": ".allocator",
    "SWAAllocator": ".allocator",
    "TokenAllocator": ".allocator",
    "CONTRACT_VERSION": ".history",
    "VERSIONS": ".history",
    "ContractVersion": ".history",
    "HiSparsePool": ".pool",
    "IndexerKeyPool": ".pool",
    "KVPool": ".pool",
    "LayerLike": ".pool",
    "MambaStatePool": ".pool",
    "MLAPool": ".pool",
    "OffloadablePool": ".pool",
    "SlidingWindowPool": ".pool",
    "KVSnapshot": ".snapshot",
    "PartLayout": ".snapshot",
    "expect_snapshot": ".snapshot",
    "BASE_PROTOCOLS": ".spec",
    "CAPABILITY_PROTOCOLS": ".spec",
    "Capability": ".spec",
    "PoolConfig": ".spec",
    "PoolFactory": ".spec",
    "PoolSpec": ".spec",
    "KVWriteLoc": ".writeloc",
    "unwrap_write_loc": ".writeloc",
}


__getattr__, __dir__ = _lazy_exports(globals(), _LAZY)


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
