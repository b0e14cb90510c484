"""The ``swa`` plugin: full-attention layers plus sliding-window layers with their own slots.

The pool lives in ``_swa_pool`` and the allocator in ``_swa_allocator``; this module is the
plugin face (factory and hook), as small as a third party's would be. See ``docs/pools/swa.md``.
"""

from __future__ import annotations

from kvcache_core import Capability, PoolConfig, PoolSpec, hookimpl

from ._layers import head_major_option
from ._swa_allocator import SWASlotAllocator
from ._swa_pool import CheckedSWASnapshot, SWAKVPool

__all__ = ["CheckedSWASnapshot", "SWAKVPool", "SWASlotAllocator", "create", "kvcache_pool_specs"]


def create(config: PoolConfig) -> tuple[SWAKVPool, SWASlotAllocator]:
    """Build an SWA pool and its allocator (which registers the full->window table).

    ``swa_layer_ids`` are global layer ids; ``swa_size`` (window slots) defaults to ``size``;
    ``swa_head_num``/``swa_head_dim`` default to the full layers' geometry. When the window
    has its own ``swa_head_dim`` its values use that dim too (``v_head_dim`` is the full
    layers'). ``config.options["head_major"]`` (a bool, default False) keeps both sides'
    rows head-major, as the ``mha`` pool's option does.
    """
    swa_size = config.swa_size if config.swa_size is not None else config.size
    head_major = head_major_option(config)  # refused before anything is allocated
    pool = SWAKVPool(
        size=config.size,
        swa_size=swa_size,
        page_size=config.page_size,
        dtype=config.dtype,
        head_num=config.head_num,
        head_dim=config.head_dim,
        layer_num=config.layer_num,
        swa_layer_ids=config.swa_layer_ids,
        device=config.device,
        v_head_dim=config.v_head_dim,
        swa_head_num=config.swa_head_num,
        swa_head_dim=config.swa_head_dim,
        swa_v_head_dim=config.v_head_dim if config.swa_head_dim is None else None,
        start_layer=config.start_layer,
        check_write_slots=config.checks_write_slots,
        head_major=head_major,
    )
    return pool, SWASlotAllocator(config.size, swa_size, config.page_size, pool)


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    return [
        PoolSpec(
            name="swa",
            pool_class=SWAKVPool,
            allocator_class=SWASlotAllocator,
            factory=create,
            capabilities=frozenset(
                {Capability.OFFLOAD, Capability.SLIDING_WINDOW, Capability.PAGED}
            ),
            description="full-attention layers plus sliding-window layers in a smaller pool",
        )
    ]
