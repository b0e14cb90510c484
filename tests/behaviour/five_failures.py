"""A pool with five independent bugs, each of which one gallery pool has alone: the behaviour
level must report five findings, one per failing check, each with its own message and
reproduction (not one finding and four "reported under" lines)."""

from __future__ import annotations

from typing import Any

from kvcache_core import Capability, PoolConfig, PoolSpec
from kvcache_plugins.mha import create as create_mha

from .gallery_core import FlippedReloadMHA, LeakyMHA
from .gallery_inputs import HalfWritePool, TwiceAllocator, UndercountPool

__all__ = ["FIVE_CHECKS", "FIVE_FAILURES"]


class FiveBugsPool(LeakyMHA, FlippedReloadMHA, UndercountPool, HalfWritePool):
    """Leaks a batched write into the next layer, reloads reversed, reports K bytes only, and
    stores K before checking V."""


def five_bugs(config: PoolConfig) -> tuple[Any, Any]:
    pool, _ = create_mha(config)
    pool.__class__ = FiveBugsPool
    # The allocator hands a freed page out again with every alloc.
    return pool, TwiceAllocator(config.size, config.page_size, pool)


FIVE_FAILURES = PoolSpec(
    name="five-failures",
    pool_class=FiveBugsPool,
    allocator_class=TwiceAllocator,
    factory=five_bugs,
    capabilities=frozenset({Capability.OFFLOAD, Capability.PAGED}),
    description="five bugs at once (behaviour gallery)",
)

#: The checks it fails, each for the bug of its own gallery pool.
FIVE_CHECKS = frozenset(
    {
        "write-isolation",
        "offload-roundtrip",
        "kv-size-bytes",
        "bad-write-rejected",
        "allocator-state-machine",
    }
)
