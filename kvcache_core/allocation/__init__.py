"""Allocators a pool may use as they are or subclass: public API, re-exported by ``kvcache_core``.

Why public: every pool needs an allocator, the contract's allocator rules (no partial
allocation, double frees rejected, backups that include queued frees, forwarded offload
arguments) are the hard part, and a third-party pool should get them from the same code the
built-ins use, visible to every checker level (a base class in ``kvcache_core`` is one the
types level can see).
"""

from __future__ import annotations

from .composite import CompositeAllocator, SettledCall
from .free_group import FreeGroup, free_calls_one_by_one
from .offload import ForwardsOffload
from .paged import DecodePlan, ExtendPlan, PagedSlotAllocator, SettleListener, TokenSlotAllocator

__all__ = [
    "CompositeAllocator",
    "DecodePlan",
    "ExtendPlan",
    "ForwardsOffload",
    "FreeGroup",
    "PagedSlotAllocator",
    "SettleListener",
    "SettledCall",
    "TokenSlotAllocator",
    "free_calls_one_by_one",
]
