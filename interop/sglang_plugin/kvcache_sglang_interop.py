"""sglang 0.5.14's own pools and allocators, registered as a kvcache plugin (``make interop``).

Why: the checker should judge real engine code the way it judges a third-party pool, and every
difference it finds must be one docs/engines.md ("Coming from sglang") lists. The glue is thin on
purpose: each factory calls sglang's constructors with the ``PoolConfig`` fields they take, and
the classes the specs name are sglang's own, unwrapped, so every finding is about sglang's code.
The only substitutions are for GPU-only code sglang's CPU path cannot run: the stand-in modules
of ``interop/_stubs.py`` (installed before sglang is imported); for the paged allocator,
sglang's own CPU implementation of its triton page kernel (``alloc_extend_naive``) in place of
the kernel; and for the MLA pool, the two triton kernels that scatter and gather latent rows
(``set_mla_kv_buffer_triton``, ``get_mla_kv_buffer_triton``) as the plain row copies they are.

Installed only into ``.venv-interop`` (``interop/sglang_plugin/pyproject.toml``), never into the
project's own environment: nothing else imports sglang.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

_INTEROP = Path(__file__).resolve().parents[1]
if str(_INTEROP) not in sys.path:
    sys.path.insert(0, str(_INTEROP))

import _stubs  # noqa: E402

os.environ.setdefault("SGLANG_NATIVE_MOVE_KV_CACHE", "1")  # its torch path, not triton
_stubs.install(hollow=_stubs.SGLANG_HOLLOW, forced=_stubs.SGLANG_FORCED)

import torch  # noqa: E402
from sglang.srt.mem_cache import memory_pool  # noqa: E402
from sglang.srt.mem_cache.allocator import paged  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402

from kvcache_core import Capability, PoolConfig, PoolSpec, hookimpl  # noqa: E402

MHATokenToKVPool = memory_pool.MHATokenToKVPool
MLATokenToKVPool = memory_pool.MLATokenToKVPool


class _PageKernel:
    """sglang's triton page kernels as its own CPU code: ``kernel[grid](*args)``."""

    def __init__(self, decode: bool) -> None:
        self.decode = decode

    def __getitem__(self, grid: object) -> _PageKernel:
        return self

    def __call__(self, *args: Any) -> None:
        if self.decode:  # (seq_lens, last_loc, free_pages, out, bs_pow2, page_size)
            seq_lens, last_loc, free_pages, out, _, page_size = args
            prefix_lens = seq_lens - 1
        else:  # (prefix_lens, seq_lens, last_loc, free_pages, out, bs_pow2, page_size)
            prefix_lens, seq_lens, last_loc, free_pages, out, _, page_size = args
        paged.alloc_extend_naive(
            prefix_lens, seq_lens, last_loc, free_pages, out, page_size, out.device
        )


paged.alloc_extend_kernel = _PageKernel(decode=False)
paged.alloc_decode_kernel = _PageKernel(decode=True)


def _set_mla_rows(kv: torch.Tensor, loc: torch.Tensor, nope: torch.Tensor, rope: Any) -> None:
    """What sglang's triton MLA scatter does: row ``loc[i]`` = ``nope[i] ++ rope[i]``."""
    kv[loc] = torch.cat([nope, rope], dim=-1).to(kv.dtype)


def _get_mla_rows(kv: torch.Tensor, loc: torch.Tensor, nope: torch.Tensor, rope: Any) -> None:
    """What sglang's triton MLA gather does: split rows ``loc`` into the two outputs."""
    rows = kv[loc]
    width = nope.shape[-1]
    nope.copy_(rows[..., :width])
    rope.copy_(rows[..., width : width + rope.shape[-1]])


memory_pool.set_mla_kv_buffer_triton = _set_mla_rows
memory_pool.get_mla_kv_buffer_triton = _get_mla_rows


def _device(config: PoolConfig) -> str:
    return str(config.device)  # sglang's constructors take the device as a string


def _mha(config: PoolConfig, **extra: Any) -> Any:
    return MHATokenToKVPool(
        size=config.size,
        page_size=config.page_size,
        dtype=config.dtype,
        head_num=config.head_num,
        head_dim=config.head_dim,
        layer_num=config.layer_num,
        device=_device(config),
        enable_memory_saver=False,
        **extra,
    )


def create_mha(config: PoolConfig) -> tuple[Any, Any]:
    """sglang's MHA pool with its token allocator (page size 1)."""
    pool = _mha(config)
    return pool, TokenToKVPoolAllocator(
        config.size, config.dtype, _device(config), pool, need_sort=False
    )


def create_paged(config: PoolConfig) -> tuple[Any, Any]:
    """sglang's MHA pool with its paged allocator."""
    pool = _mha(config)
    allocator = PagedTokenToKVPoolAllocator(
        config.size, config.page_size, config.dtype, _device(config), pool, need_sort=False
    )
    return pool, allocator


def create_mla(config: PoolConfig) -> tuple[Any, Any]:
    """sglang's MLA pool with its token allocator."""
    assert config.kv_lora_rank is not None and config.qk_rope_head_dim is not None
    pool = MLATokenToKVPool(
        size=config.size,
        page_size=config.page_size,
        dtype=config.dtype,
        kv_lora_rank=config.kv_lora_rank,
        qk_rope_head_dim=config.qk_rope_head_dim,
        layer_num=config.layer_num,
        device=_device(config),
        enable_memory_saver=False,
    )
    return pool, TokenToKVPoolAllocator(
        config.size, config.dtype, _device(config), pool, need_sort=False
    )


def create_swa(config: PoolConfig) -> tuple[Any, Any]:
    """sglang's hybrid SWA pool (a full and a window MHA pool) with its SWA allocator."""
    window = list(config.swa_layer_ids)
    full = [i for i in range(config.layer_num) if i not in window]
    size_swa = config.swa_size if config.swa_size is not None else config.size
    pool = SWAKVPool(
        size=config.size,
        size_swa=size_swa,
        page_size=config.page_size,
        dtype=config.dtype,
        head_num=config.head_num,
        head_dim=config.head_dim,
        swa_attention_layer_ids=window,
        full_attention_layer_ids=full,
        enable_kvcache_transpose=False,
        device=_device(config),
    )
    allocator = SWATokenToKVPoolAllocator(
        config.size,
        size_swa,
        config.page_size,
        config.dtype,
        _device(config),
        pool,
        need_sort=False,
    )
    return pool, allocator


_OFFLOAD = Capability.OFFLOAD


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    """sglang's pools, each declaring the capabilities sglang's engine relies on."""
    return [
        PoolSpec(
            name="sglang-mha",
            pool_class=MHATokenToKVPool,
            allocator_class=TokenToKVPoolAllocator,
            factory=create_mha,
            capabilities=frozenset({_OFFLOAD}),
            description="sglang 0.5.14 MHATokenToKVPool + TokenToKVPoolAllocator",
        ),
        PoolSpec(
            name="sglang-paged",
            pool_class=MHATokenToKVPool,
            allocator_class=PagedTokenToKVPoolAllocator,
            factory=create_paged,
            capabilities=frozenset({_OFFLOAD, Capability.PAGED}),
            description="sglang 0.5.14 MHATokenToKVPool + PagedTokenToKVPoolAllocator",
        ),
        PoolSpec(
            name="sglang-mla",
            pool_class=MLATokenToKVPool,
            allocator_class=TokenToKVPoolAllocator,
            factory=create_mla,
            capabilities=frozenset({_OFFLOAD, Capability.MLA}),
            description="sglang 0.5.14 MLATokenToKVPool + TokenToKVPoolAllocator",
        ),
        PoolSpec(
            name="sglang-swa",
            pool_class=SWAKVPool,
            allocator_class=SWATokenToKVPoolAllocator,
            factory=create_swa,
            capabilities=frozenset({_OFFLOAD, Capability.SLIDING_WINDOW}),
            description="sglang 0.5.14 SWAKVPool + SWATokenToKVPoolAllocator",
        ),
    ]


__all__ = ["create_mha", "create_mla", "create_paged", "create_swa", "kvcache_pool_specs"]
_ = torch  # the factories' configs carry torch dtypes; imported before sglang for the stubs
