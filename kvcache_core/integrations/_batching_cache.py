"""transformers' paged attention cache with a kvcache pool as its storage.

transformers keeps two things in its ``PagedAttentionCache``: the *accounting* (sectors and
blocks per request, which its scheduler admits and offloads by) and the *storage* (one byte
arena that its allocators index). This subclass keeps the accounting untouched and moves the
storage: every key and value is written with the pool's ``set_kv_buffer`` and read from the
pool's buffers, at slots the pool's own allocator handed out, one pool page per transformers
block (the page size is the block size). transformers' arena is still allocated by its
constructor but never read or written here.

The seams are the cache's public methods that the batch code calls:
``extend_read_and_write_indices`` (the slots of a batch, per request), ``update`` (one layer's
write and read) and ``free_blocks`` (a request ends or is offloaded). The index lists this
class returns hold pool slots, not arena offsets.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.generation.continuous_batching.cache_allocators import (
    FullAttentionCacheAllocator,
    SlidingAttentionCacheAllocator,
)

from ..contracts import KVSnapshot, PoolConfig, SlidingWindowPool, SWAAllocator
from ..errors import AllocatorError, KVCacheError, UnsupportedDtypeError
from ._hf_pool_choice import FULL_ATTENTION, SLIDING_ATTENTION, PoolChoice


@dataclass(frozen=True)
class _Layer:
    """The ``layer`` argument of ``set_kv_buffer``: anything with a ``layer_id``."""

    layer_id: int


@dataclass
class BatchingStats:
    """What a continuous-batching run did with its kvcache pool, counted as it happened.

    ``offloads`` counts the allocator's ``get_cpu_copy`` calls (one per request moved to the
    host under block pressure) and ``restores`` its ``load_cpu_copy`` calls (one per request
    brought back into newly allocated slots); ``offloaded_tokens`` and ``offloaded_bytes`` add
    up what those snapshots held. ``pool`` is the pool's registry name and ``pages`` the pages
    it was built with (transformers' block capacity).
    """

    pool: str = ""
    """The registry name of the pool the run stored keys and values in."""
    pages: int = 0
    """The pages the pool was built with: transformers' block capacity."""
    offloads: int = 0
    """Requests moved to the host under block pressure (allocator ``get_cpu_copy`` calls)."""
    restores: int = 0
    """Requests brought back into new slots (allocator ``load_cpu_copy`` calls)."""
    offloaded_tokens: int = 0
    """Tokens the offloaded snapshots held, summed over every offload."""
    offloaded_bytes: int = 0
    """Bytes the offloaded snapshots held, summed over every offload."""


@dataclass
class _Request:
    """Every slot of the pool pages one request holds, in token order (whole pages, so page
    ``i`` is ``slots[i * page : (i + 1) * page]``), and how many tokens are written.

    Kept as slots rather than page ids: each batch reads a request's slots as one list slice
    (every step of every request asks for them, so building them page by page each time cost
    more than transformers' own bookkeeping).
    """

    slots: list[int] = field(default_factory=list)
    length: int = 0
    window_released: int = 0  # leading pages whose window slots went back (SWA pools)


@dataclass(frozen=True)
class CapturedRequest:
    """An offloaded request's snapshot and how many of its tokens it holds."""

    snapshot: KVSnapshot
    tokens: int


class KVPoolPagedCache(PagedAttentionCache):
    """A ``PagedAttentionCache`` whose keys and values live in a kvcache pool.

    Built by transformers' batch processor with its usual arguments plus ``choice`` (the pool
    to build) and ``stats``; the pool is sized to the cache's block capacity, one page of
    ``page_size`` slots per block. Forks, prefix sharing and the block-table decode path are
    transformers features that address its arena directly, so they are refused here (the
    manager switches them off before this class is built).
    """

    def __init__(self, *, choice: PoolChoice, stats: BatchingStats, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if FULL_ATTENTION not in self.cache_allocators:
            raise KVCacheError("a model without full-attention layers is not supported yet")
        full = cast(FullAttentionCacheAllocator, self.cache_allocators[FULL_ATTENTION])
        self.page = int(full.tokens_per_page)
        pages = int(self.num_sectors) * int(full.blocks_per_sector)
        config = self.config
        groups = choice.groups
        pool_config = PoolConfig(
            size=pages * self.page,
            layer_num=int(config.num_hidden_layers),
            head_num=int(full.num_key_value_heads),
            head_dim=int(full.head_dim),
            page_size=self.page,
            dtype=self.dtype,
            device=torch.device(self.device),
            swa_layer_ids=groups.get(SLIDING_ATTENTION, ()) if choice.windowed else (),
            swa_size=pages * self.page,
            # Every slot written comes from this pool's allocator, through this class: the
            # per-write range check (a read-back on CPU) would only re-prove that.
            validate_write_slots=False,
            # Pools that can keep rows head-major do: each step gathers a batch's keys per head
            # straight into the ``[heads, tokens, dim]`` block attention expands, rather than
            # gathering rows and copying them again through a transposed view.
            options={"head_major": True},
        )
        self.kv_pool, self.kv_allocator = choice.registry.create(choice.name, pool_config)
        if self.kv_pool.dtype != self.dtype:
            raise UnsupportedDtypeError(
                f"pool {choice.name!r} stores {self.kv_pool.dtype}, the model computes in "
                f"{self.dtype}: continuous batching needs the model's dtype, bit for bit"
            )
        self.stats = stats
        stats.pool, stats.pages = choice.name, pages
        self._window_layers: frozenset[int] = frozenset()
        self._window = 0
        if choice.windowed:
            if not isinstance(self.kv_pool, SlidingWindowPool) or not isinstance(
                self.kv_allocator, SWAAllocator
            ):
                raise KVCacheError(
                    f"pool {choice.name!r} declares sliding-window but its pool or allocator "
                    "lacks the SlidingWindowPool / SWAAllocator members"
                )
            self._window_layers = frozenset(groups[SLIDING_ATTENTION])
        if SLIDING_ATTENTION in self.cache_allocators:
            sliding = cast(SlidingAttentionCacheAllocator, self.cache_allocators[SLIDING_ATTENTION])
            self._window = int(sliding.sliding_window)
        self._has_full = FULL_ATTENTION in self.cache_allocators
        self._layers = {i: _Layer(i) for i in range(int(config.num_hidden_layers))}
        #: Per layer: its key and value buffers seen head-major, and whether they are stored so.
        self._by_head: dict[int, tuple[torch.Tensor, torch.Tensor, bool]] = {}
        self._requests: dict[str, _Request] = {}
        self._capture: dict[str, CapturedRequest] | None = None
        self._lock = threading.Lock()
        # Padding tokens (static-shape batches only) read and write the pool's padding slot 0.
        for allocator in self.cache_allocators.values():
            allocator.read_trash_index = 0
            allocator.write_trash_index = 0

    # -- slots ---------------------------------------------------------------------------------
    def _slot_tensor(self, slots: list[int]) -> torch.Tensor:
        """``slots`` as the pool's allocator takes them (int64 on the pool's device)."""
        return torch.tensor(slots, dtype=torch.int64, device=self.kv_pool.device)

    def _grow(self, req: _Request, tokens: int) -> None:
        """Give ``req`` pages for ``tokens`` tokens, from the pool's allocator."""
        need = -(-tokens // self.page) - len(req.slots) // self.page
        if need <= 0:
            return
        got = self.kv_allocator.alloc(need * self.page)
        if got is None:
            raise AllocatorError(
                f"the pool's allocator has {self.kv_allocator.available_size()} free slots, "
                f"{need * self.page} needed: transformers' block accounting and the pool "
                "disagree (was the pool shared with another engine?)"
            )
        req.slots.extend(got.tolist())

    def _release_window(self, req: _Request, past_length: int) -> None:
        """Window slots of pages every future read has slid past go back (SWA pools)."""
        if not self._window_layers:
            return
        gone = max(past_length - (self._window - 1), 0) // self.page
        if gone > req.window_released:
            page = self.page
            slots = req.slots[req.window_released * page : gone * page]
            self.kv_allocator.free_swa(self._slot_tensor(slots))
            req.window_released = gone

    def extend_read_and_write_indices(
        self,
        request_id: str,
        past_length: int,
        query_length: int,
        read_index: list[list[int]] | None,
        write_index: list[list[int]],
    ) -> None:
        """Append this request's pool slots for one batch: writes at tokens
        ``[past, past + query)``; reads of every token (full layers) or of the last
        ``window - 1`` cached tokens and the new ones (sliding layers)."""
        with self._lock:
            req = self._requests.setdefault(request_id, _Request())
            if past_length > req.length:
                raise KVCacheError(
                    f"request {request_id} continues at token {past_length} but the pool holds "
                    f"{req.length} of its tokens"
                )
            end = past_length + query_length
            self._release_window(req, past_length)
            self._grow(req, end)
            req.length = end
            if read_index is None:
                new = req.slots[past_length:end]
                for indices in write_index:
                    indices.extend(new)
                return
            # One slot list serves every group: full layers read all of it, sliding layers its
            # tail, and the writes are its last ``query_length`` slots.
            window_start = past_length - min(past_length, self._window - 1)
            first = 0 if self._has_full else window_start
            slots = req.slots[first:end]
            new = slots[len(slots) - query_length :]
            for allocator, reads, writes in zip(
                self.cache_allocators.values(), read_index, write_index, strict=True
            ):
                writes.extend(new)
                if allocator.layer_type == SLIDING_ATTENTION:
                    reads.extend(slots[window_start - first :])
                else:
                    reads.extend(slots)

    # -- the attention layers' read and write -------------------------------------------------
    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        kwargs: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one layer's new keys and values into the pool, then read back what attention
        needs (``[1, heads, tokens, dim]``, the layout transformers' paged attention expects)."""
        allocator = self.layer_to_allocator[layer_idx]
        kwargs["cu_seq_lens_k"] = kwargs["cu_seq_lens_k"][allocator.layer_type].to(torch.int32)
        kwargs["max_length_k"] = kwargs["max_length_k"][allocator.layer_type]
        if kwargs.get("block_table") is not None:
            raise KVCacheError("the block-table decode path reads transformers' own arena")
        read = kwargs["read_index"][allocator.index]
        write = kwargs["write_index"][allocator.index]
        new_k = key_states[0].transpose(0, 1)
        new_v = value_states[0].transpose(0, 1)
        self.kv_pool.set_kv_buffer(self._layers[layer_idx], write, new_k, new_v)
        if read.numel() == 0:
            return key_states, value_states
        if layer_idx in self._window_layers:
            read = self.kv_pool.translate_loc_from_full_to_swa(read)
        k_heads, v_heads, head_major = self._buffers_by_head(layer_idx)
        if head_major:  # gather each head's rows into one contiguous block
            return k_heads.index_select(1, read)[None], v_heads.index_select(1, read)[None]
        k_buf, v_buf = k_heads.transpose(0, 1), v_heads.transpose(0, 1)
        keys = k_buf.index_select(0, read).transpose(0, 1).unsqueeze(0)
        values = v_buf.index_select(0, read).transpose(0, 1).unsqueeze(0)
        return keys, values

    def _buffers_by_head(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Layer ``layer_idx``'s buffers as ``[heads, slots, dim]`` views, looked up once, and
        whether each head's slots are contiguous there (a head-major pool)."""
        found = self._by_head.get(layer_idx)
        if found is None:
            k_buf, v_buf = self.kv_pool.get_kv_buffer(layer_idx)
            k_heads, v_heads = k_buf.transpose(0, 1), v_buf.transpose(0, 1)
            found = (k_heads, v_heads, k_heads.is_contiguous() and v_heads.is_contiguous())
            self._by_head[layer_idx] = found
        return found

    # -- requests leaving --------------------------------------------------------------------
    def _release(self, request_id: str) -> None:
        req = self._requests.pop(request_id, None)
        if req is None or not req.slots:
            return
        slots = self._slot_tensor(req.slots)
        if self._capture is not None and req.length > 0:
            snapshot = self.kv_allocator.get_cpu_copy(slots[: req.length])
            self._capture[request_id] = CapturedRequest(snapshot, req.length)
            self.stats.offloads += 1
            self.stats.offloaded_tokens += req.length
            self.stats.offloaded_bytes += snapshot.nbytes
        self.kv_allocator.free(slots)

    def free_blocks(self, request_id: str, no_cache: bool = False) -> None:
        """transformers frees the request's blocks; its pool pages go back to the allocator
        (snapshotted first while an offload is capturing)."""
        super().free_blocks(request_id, no_cache)
        with self._lock:
            self._release(request_id)

    def free_all_requests(self, clear_ledgers: bool = False) -> None:
        """Every request's blocks and pool pages are freed."""
        super().free_all_requests(clear_ledgers)
        with self._lock:
            for request_id in list(self._requests):
                self._release(request_id)

    @contextmanager
    def capturing(self) -> Iterator[dict[str, CapturedRequest]]:
        """While open, ``free_blocks`` snapshots a request's written tokens through the
        allocator's ``get_cpu_copy`` before freeing them: transformers' offload frees a victim's
        blocks first and copies them afterwards, by which time the pages are free."""
        captured: dict[str, CapturedRequest] = {}
        self._capture = captured
        try:
            yield captured
        finally:
            self._capture = None

    def restore(self, request_id: str, captured: CapturedRequest, keep: int) -> None:
        """Load an offloaded request into newly allocated pages with ``load_cpu_copy``;
        ``keep`` is how many of its tokens transformers resumes from."""
        if keep > captured.tokens:
            raise KVCacheError(
                f"request {request_id} resumes at token {keep} but its snapshot holds "
                f"{captured.tokens} tokens"
            )
        with self._lock:
            if request_id in self._requests:
                raise KVCacheError(f"request {request_id} is live: it cannot be restored")
            req = _Request()
            self._grow(req, captured.tokens)
            slots = self._slot_tensor(req.slots)
            try:
                self.kv_allocator.load_cpu_copy(captured.snapshot, slots[: captured.tokens])
            except BaseException:
                self.kv_allocator.free(slots)
                raise
            req.length = keep
            self._requests[request_id] = req
            self.stats.restores += 1

    # -- transformers features that address the arena ------------------------------------------
    def prepare_fork_request(self, *args: Any, **kwargs: Any) -> list[str]:
        """Forking copies arena blocks; refused (``num_return_sequences`` must be 1)."""
        raise KVCacheError("forking requests (num_return_sequences > 1) is not supported")

    def fill_block_table(self, *args: Any, **kwargs: Any) -> None:
        """The block-table decode path has kernels read the arena; refused."""
        raise KVCacheError("the block-table decode path reads transformers' own arena")
