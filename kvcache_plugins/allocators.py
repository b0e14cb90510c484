"""The built-in pools' allocators, kept importable here for existing code.

They are public API of ``kvcache_core`` now (``kvcache_core.PagedSlotAllocator``); import them
from there. This module only re-exports them, as any third party could.
"""

from __future__ import annotations

from kvcache_core import PagedSlotAllocator, TokenSlotAllocator

__all__ = ["PagedSlotAllocator", "TokenSlotAllocator"]
