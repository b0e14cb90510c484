"""Small allocators of every built-in kind, built the way an engine builds them (the plugins'
own factories), for the allocator regression tests and state machines."""

from __future__ import annotations

import torch

from kvcache_core import PoolConfig
from kvcache_plugins import hisparse, mamba, swa
from kvcache_plugins._hisparse_alloc import HiSparseSlotAllocator
from kvcache_plugins._swa_allocator import SWASlotAllocator
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mamba import HybridMambaAllocator
from kvcache_plugins.mha import MHATokenToKVPool
from kvcache_plugins.mla import MLATokenToKVPool


def paged(size: int, page_size: int = 1) -> PagedSlotAllocator:
    """The MHA pool's allocator (a token allocator when ``page_size`` is 1)."""
    pool = MHATokenToKVPool(size, page_size, torch.float32, 1, 1, 1)
    return PagedSlotAllocator(size, page_size, pool)


def mla(size: int, page_size: int = 1) -> PagedSlotAllocator:
    pool = MLATokenToKVPool(size, page_size, torch.float32, 2, 1, 1)
    return PagedSlotAllocator(size, page_size, pool)


def hybrid(size: int, page_size: int = 1, requests: int = 4) -> HybridMambaAllocator:
    return mamba.create(
        PoolConfig(
            size=size,
            page_size=page_size,
            layer_num=2,
            head_num=1,
            head_dim=1,
            mamba_layer_ids=(1,),
            mamba_size=requests,
            temporal_state_shape=(1,),
        )
    )[1]


def swa_alloc(size: int, swa_size: int, page_size: int = 1) -> SWASlotAllocator:
    return swa.create(
        PoolConfig(
            size=size,
            swa_size=swa_size,
            page_size=page_size,
            layer_num=2,
            head_num=1,
            head_dim=1,
            swa_layer_ids=(1,),
        )
    )[1]


def hisparse_alloc(size: int, page_size: int = 1, ratio: int = 2) -> HiSparseSlotAllocator:
    """``size`` device slots, ``size * ratio`` logical slots."""
    return hisparse.create(
        PoolConfig(
            size=size,
            page_size=page_size,
            layer_num=1,
            kv_lora_rank=1,
            qk_rope_head_dim=1,
            index_head_dim=1,
            hisparse_ratio=ratio,
        )
    )[1]
