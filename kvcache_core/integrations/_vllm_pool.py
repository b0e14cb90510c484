"""A kvcache pool over the KV tensors vLLM's CPU attention backend allocates (no memory of its own).

vLLM's CPU backend gives every attention layer one tensor ``[num_blocks, kv_heads, block_size,
2 * head_size]``. Within each (block, head) the first ``block_size * head_size`` values are the
keys stored transposed, ``[head_size, block_size]``, and the rest are the values,
``[block_size, head_size]`` (what ``cpu_attn_reshape_and_cache`` writes; the tests check it
against vLLM's own kernel). Block 0 is vLLM's null block, so it is this pool's reserved page 0:
slot ``s`` is token ``s % block_size`` of block ``s // block_size``.

Snapshots are the ``mha`` pool's: per-layer K and V ``[layers, tokens, heads, head_size]``,
token-major, the transpose undone, so a snapshot taken here loads into kvcache's own ``mha`` pool
and back bit for bit. That is why ``kind`` is ``"mha"``: it names the layout of what the pool
holds and hands out; the pool's registry name is ``vllm-cpu``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..allocation.paged import PagedSlotAllocator
from ..contracts.pool import LayerLike
from ..contracts.snapshot import KVSnapshot, expect_snapshot
from ..contracts.spec import Capability, PoolConfig, PoolSpec
from ..contracts.writeloc import KVWriteLoc, unwrap_write_loc
from ..errors import InvalidLayerError, InvalidSlotError, UnsupportedDtypeError
from ..hookspecs import hookimpl
from ..storage import host_empty, host_zeros
from ..validation import check_rows, check_slots

__all__ = ["VLLMBlockPool", "create", "kvcache_pool_specs", "vllm_cpu_pool_spec"]


class VLLMBlockPool:
    """The KV tensors of one vLLM worker as a kvcache pool (``KVPool`` + ``OffloadablePool``).

    :param kv_caches: One tensor per attention layer, in layer order, each ``[num_blocks,
        kv_heads, block_size, 2 * head_size]`` (vLLM's CPU layout), all of one shape, dtype and
        device. The pool keeps views of them: vLLM and the pool read and write the same memory.
    :raises ValueError: No tensors, tensors of different shapes, dtypes or devices, or a shape
        that is not the CPU layout (the message says which).
    :raises UnsupportedDtypeError: A cache that is not floating point (vLLM's fp8 KV cache).
    """

    kind = "mha"

    def __init__(self, kv_caches: Sequence[torch.Tensor]) -> None:
        caches = list(kv_caches)
        if not caches:
            raise ValueError("a vLLM block pool needs at least one layer's KV cache tensor")
        first = caches[0]
        for i, t in enumerate(caches):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(
                    f"layer {i}: expected a [num_blocks, kv_heads, block_size, 2 * head_size] "
                    f"tensor (vLLM's CPU layout), got {getattr(t, 'shape', type(t).__name__)}"
                )
            if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
                raise ValueError(
                    f"layer {i} is {list(t.shape)} {t.dtype} on {t.device}; layer 0 is "
                    f"{list(first.shape)} {first.dtype} on {first.device}: one pool holds one "
                    "geometry"
                )
            if not t.is_contiguous():
                raise ValueError(f"layer {i}: the KV cache tensor is not contiguous")
        blocks, heads, block_size, width = (int(d) for d in first.shape)
        if width % 2 or blocks < 2:
            raise ValueError(
                f"shape {list(first.shape)}: the last dimension must be 2 * head_size and there "
                "must be a block besides the null block 0"
            )
        if not first.dtype.is_floating_point:
            raise UnsupportedDtypeError(
                f"a vLLM block pool reads floating-point KV caches; {first.dtype} (an fp8 "
                "cache stored as bytes) is not supported"
            )
        self.num_blocks = blocks
        """vLLM's blocks per layer, the null block 0 included."""
        self.page_size = block_size
        self.size = (blocks - 1) * block_size
        self.dtype = first.dtype
        self.device = first.device
        self.layer_num = len(caches)
        self.head_num = heads
        self.head_dim = width // 2
        self.start_layer = 0
        self.caches = tuple(caches)
        """The tensors vLLM registered, as given (what its kernels read and write)."""
        half = block_size * self.head_dim
        flat = [t.view(blocks, heads, 2 * half) for t in caches]
        # K^T and V of every block and head, as they lie in memory.
        self._k_blocks = tuple(
            f[:, :, :half].view(blocks, heads, self.head_dim, block_size) for f in flat
        )
        self._v_blocks = tuple(
            f[:, :, half:].view(blocks, heads, block_size, self.head_dim) for f in flat
        )
        # The same memory seen token-major, [block, token in block, head, dim] (strided views).
        self._k_tokens = tuple(k.permute(0, 3, 1, 2) for k in self._k_blocks)
        self._v_tokens = tuple(v.permute(0, 2, 1, 3) for v in self._v_blocks)

    @property
    def rows(self) -> int:
        """Token slots per layer, the null block's included: ``size + page_size``."""
        return self.size + self.page_size

    def _local(self, layer_id: int) -> int:
        if not isinstance(layer_id, int) or isinstance(layer_id, bool):
            raise InvalidLayerError(f"layer_id must be an int, got {type(layer_id).__name__}")
        if not 0 <= layer_id < self.layer_num:
            raise InvalidLayerError(
                f"layer {layer_id} is not in this pool (it holds layers 0..{self.layer_num - 1})"
            )
        return layer_id

    # -- buffers ---------------------------------------------------------------------------
    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s keys token-major, ``[size + page_size, heads, head_size]``.

        A copy, not a view: vLLM stores each block's keys transposed, and no strided view maps
        a token slot to those positions. vLLM's kernels read ``caches`` themselves; this getter
        is what a reader of the contract (the checker, a test) compares against.
        """
        k = self._k_tokens[self._local(layer_id)]
        return k.reshape(self.rows, self.head_num, self.head_dim)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s values token-major; a copy, like ``get_key_buffer``."""
        v = self._v_tokens[self._local(layer_id)]
        return v.reshape(self.rows, self.head_num, self.head_dim)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def get_kv_size_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.caches)

    # -- writes ----------------------------------------------------------------------------
    def _split(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.div(slots, self.page_size, rounding_mode="floor"), slots % self.page_size

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        layer_id = getattr(layer, "layer_id", None)
        if not isinstance(layer_id, int) or isinstance(layer_id, bool):
            raise InvalidLayerError(
                f"layer must have an integer `layer_id`, got {type(layer).__name__}"
            )
        local = self._local(layer_id)
        if not isinstance(loc, (torch.Tensor, KVWriteLoc)):
            raise InvalidSlotError(
                f"loc must be a torch.Tensor of slot indices or a KVWriteLoc, got "
                f"{type(loc).__name__}"
            )
        full, _ = unwrap_write_loc(loc)  # no window side here: swa_loc is not ours
        slots = check_slots(full, limit=self.rows, name="loc", allow_zero=True, device=self.device)
        n = slots.numel()
        row = (self.head_num, self.head_dim)
        k = check_rows(cache_k, name="cache_k", rows=n, row_shape=row)
        v = check_rows(cache_v, name="cache_v", rows=n, row_shape=row)
        k = self._stored(k, k_scale)
        v = self._stored(v, v_scale)
        block, offset = self._split(slots)
        self._k_tokens[local].index_put_((block, offset), k)
        self._v_tokens[local].index_put_((block, offset), v)

    def _stored(self, values: torch.Tensor, scale: float | None) -> torch.Tensor:
        """Values as stored: cast to the pool's dtype (divided by ``scale`` only when the write
        casts, as engines apply it), on the pool's device."""
        if values.dtype != self.dtype:
            if scale is not None:
                values = values / scale
            values = values.to(self.dtype)
        return values.to(self.device)

    # -- offload ---------------------------------------------------------------------------
    def _offload_slots(self, indices: torch.Tensor) -> torch.Tensor:
        return check_slots(indices, limit=self.rows, allow_duplicates=False, device=self.device)

    def _meta(self) -> dict[str, object]:
        return {"layer_num": self.layer_num, "start_layer": self.start_layer}

    def _whole_blocks(self, slots: torch.Tensor) -> torch.Tensor | None:
        """Block ids when ``slots`` are whole blocks in order (the connector's case), else None."""
        n, bs = slots.numel(), self.page_size
        if n == 0 or n % bs:
            return None
        grid = slots.reshape(-1, bs)
        first = grid[:, :1]
        step = torch.arange(bs, dtype=slots.dtype, device=slots.device)
        if bool((first % bs == 0).all()) and bool((grid == first + step).all()):
            return first.reshape(-1) // bs
        return None

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        """Copy token slots ``indices`` of every layer to the host, token-major.

        ``mamba_indices`` is part of the contract and ignored: attention keeps no request state.
        Whole blocks (what the connector saves) are copied a block at a time.
        """
        slots = self._offload_slots(indices)
        n, shape = slots.numel(), (self.head_num, self.head_dim)
        k_out = host_empty((self.layer_num, n, *shape), self.dtype, self.device)
        v_out = host_empty((self.layer_num, n, *shape), self.dtype, self.device)
        blocks = self._whole_blocks(slots)
        for i in range(self.layer_num):
            if blocks is not None:
                count = blocks.numel()
                k_dst = k_out[i].view(count, self.page_size, *shape)
                v_dst = v_out[i].view(count, self.page_size, *shape)
                k_dst.copy_(self._k_tokens[i].index_select(0, blocks))
                v_dst.copy_(self._v_tokens[i].index_select(0, blocks))
            else:
                block, offset = self._split(slots)
                k_out[i].copy_(self._k_tokens[i][block, offset])
                v_out[i].copy_(self._v_tokens[i][block, offset])
        return KVSnapshot(
            pool_kind=self.kind,
            dtype=self.dtype,
            token_count=n,
            parts={"k": k_out, "v": v_out},
            meta=self._meta(),
        )

    def check_snapshot(self, snapshot: object, token_count: int) -> KVSnapshot:
        """Check that ``snapshot`` fits this pool for ``token_count`` tokens; write nothing."""
        layout = ((self.layer_num, token_count, self.head_num, self.head_dim), self.dtype)
        return expect_snapshot(
            snapshot,
            kind=self.kind,
            dtype=self.dtype,
            token_count=token_count,
            parts={"k": layout, "v": layout},
            meta=self._meta(),
        )

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        """Write ``snapshot`` into token slots ``indices`` (same count and order), checked first."""
        slots = self._offload_slots(indices)
        checked = self.check_snapshot(snapshot, slots.numel())
        blocks = self._whole_blocks(slots)
        shape = (self.head_num, self.head_dim)
        block, offset = self._split(slots)
        for i in range(self.layer_num):
            k, v = checked.parts["k"][i], checked.parts["v"][i]
            if blocks is not None:
                count = blocks.numel()
                k_src = k.to(self.device).view(count, self.page_size, *shape)
                v_src = v.to(self.device).view(count, self.page_size, *shape)
                self._k_tokens[i].index_copy_(0, blocks, k_src)
                self._v_tokens[i].index_copy_(0, blocks, v_src)
            else:
                self._k_tokens[i].index_put_((block, offset), k.to(self.device))
                self._v_tokens[i].index_put_((block, offset), v.to(self.device))


def create(config: PoolConfig) -> tuple[VLLMBlockPool, PagedSlotAllocator]:
    """A pool over freshly zeroed tensors in vLLM's CPU layout, as vLLM would allocate them.

    What the checker and tests build; inside vLLM the connector wraps the tensors vLLM
    registered instead. ``config.size`` must be a multiple of ``config.page_size`` (vLLM's block
    size) and ``v_head_dim``, when given, equal to ``head_dim`` (one head size for K and V).
    """
    if config.size % config.page_size:
        raise ValueError(
            f"size {config.size} is not a multiple of the block size {config.page_size}"
        )
    if config.v_head_dim not in (None, config.head_dim):
        raise ValueError(
            f"vLLM's CPU layout has one head size for K and V; v_head_dim {config.v_head_dim} "
            f"differs from head_dim {config.head_dim}"
        )
    if config.start_layer:
        raise ValueError("a vLLM block pool holds a worker's layers from 0 (start_layer 0)")
    shape = (
        config.size // config.page_size + 1,
        config.head_num,
        config.page_size,
        2 * config.head_dim,
    )
    caches = [host_zeros(shape, config.dtype, config.device) for _ in range(config.layer_num)]
    pool = VLLMBlockPool(caches)
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


def vllm_cpu_pool_spec() -> PoolSpec:
    """The spec of the pool over vLLM's CPU layout (registry name ``vllm-cpu``)."""
    return PoolSpec(
        name="vllm-cpu",
        pool_class=VLLMBlockPool,
        allocator_class=PagedSlotAllocator,
        factory=create,
        capabilities=frozenset({Capability.OFFLOAD, Capability.PAGED}),
        description="vLLM's CPU KV blocks (K transposed per block) seen as an mha pool",
        behaviour_config=PoolConfig(
            size=4 * 32, page_size=32, layer_num=2, head_num=2, head_dim=8, dtype=torch.float32
        ),
    )


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    """This module as a kvcache pool plugin (``kvcache check`` runs every level on it)."""
    return [vllm_cpu_pool_spec()]
