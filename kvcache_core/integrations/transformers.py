"""Hugging Face transformers generates on kvcache pools (``KVPoolCache``).

A transformers ``Cache`` whose per-layer storage is a discovered kvcache pool and whose slots
come from that pool's allocator, so ``model.generate(..., past_key_values=cache)`` (or
``cache=cache``) reads and writes the pool at every step, and a row can be retracted (offloaded
to the host through the allocator's ``get_cpu_copy``, its slots freed) and resumed into newly
allocated slots (``load_cpu_copy``) between two forward passes, as a serving engine does under
memory pressure. Importing this module imports transformers; nothing else in kvcache does.
See docs/integrations/transformers.md for the layer-type -> pool-kind table and the limits.
Continuous batching (``generate_batch``) lives in ``transformers_batching`` and is re-exported
here, so this one import path serves both.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, DummyLayer

from ..contracts.allocator import MambaSlotAllocator, SWAAllocator
from ..contracts.snapshot import KVSnapshot
from ..contracts.writeloc import KVWriteLoc
from ..discovery import Registry, discover
from ..errors import KVCacheError, UnsupportedDtypeError
from ._hf_layers import (
    PoolAttentionLayer,
    PoolLatentLayer,
    PoolSlidingLayer,
    StagedStateLayer,
)
from ._hf_layout import LayerKind, ModelLayout, UnsupportedLayerError, probe_layout
from ._hf_pool_choice import (
    MissingCapabilityError,
    choose_pool_for_layout,
    pool_config,
    required_capabilities,
)
from ._hf_rows import OutOfSlotsError, RowRetractedError, RowSlots
from .transformers_batching import (
    BatchingStats,
    BatchOutputs,
    KVPoolBatchingManager,
    generate_batch,
    kvpool_paged_cache,
)

__all__ = [
    "SUPPORTED_TRANSFORMERS",
    "BatchOutputs",
    "BatchingStats",
    "KVPoolBatchingManager",
    "KVPoolCache",
    "MissingCapabilityError",
    "OutOfSlotsError",
    "PoolDtypeError",
    "RetractedRow",
    "RowRetractedError",
    "RowStateError",
    "UnknownHandleError",
    "UnsupportedLayerError",
    "generate_batch",
    "kvpool_paged_cache",
]

#: The transformers releases this integration is tested with (the ``kvcache[hf]`` extra's pin).
SUPPORTED_TRANSFORMERS = ">=5.24,<5.25"


class PoolDtypeError(UnsupportedDtypeError):
    """The pool stores another dtype than the model computes in (nothing is cast silently)."""


class UnknownHandleError(KVCacheError, ValueError):
    """``resume`` was given a handle this cache did not hand out, or one already resumed."""


class RowStateError(KVCacheError, ValueError):
    """``retract``/``resume`` named a row that is out of range or in the wrong state."""


_handle_ids = itertools.count(1)


@dataclass(frozen=True)
class RetractedRow:
    """What [`KVPoolCache.retract`][kvcache_core.integrations.transformers.KVPoolCache.retract]
    returns: the row's host snapshot, taken through the allocator's ``get_cpu_copy``.

    Pass it back to ``resume``; it is single-use. ``old_slots`` and ``old_request_slot`` are the
    slots the row held before (already freed): tests overwrite them to prove a resume never
    reads them.
    """

    id: int
    row: int
    length: int
    snapshot: KVSnapshot
    old_slots: torch.Tensor
    old_request_slot: torch.Tensor | None = field(default=None)

    @property
    def nbytes(self) -> int:
        """Bytes the snapshot holds on the host."""
        return self.snapshot.nbytes


class KVPoolCache(Cache):
    """A transformers ``Cache`` backed by a kvcache pool and its allocator.

    Build it with [`for_model`][kvcache_core.integrations.transformers.KVPoolCache.for_model];
    use it for one ``generate`` call (or call ``release()`` to reuse it). Every attention layer
    writes its new tokens into the pool at slots the allocator handed out and reads the cached
    ones back from the pool: a one-row batch on consecutive slots of a head-major pool (what
    ``for_model`` builds an ``mha`` pool as) reads views, each head contiguous; otherwise see
    ``heads_of`` (views for short one-row contexts on consecutive slots and for single-head
    latents, one head-major copy otherwise).
    Mamba state is staged in ``[batch, ...]`` tensors that transformers updates in place and
    copied to the row's request slot in the pool before any offload (see
    docs/integrations/transformers.md).

    :param layout: What each model layer caches (from the probe in ``for_model``).
    :param pool: The pool the factory built.
    :param allocator: Its allocator.
    :param pool_name: The registry name of the pool (for reports).
    :param page_size: Slots per page (``> 1`` allocates through ``alloc_extend``/``alloc_decode``).
    """

    #: From how many positions a one-row batch on consecutive slots of a row-major pool is
    #: copied head-major rather than read in place (see ``heads_of``): below it the copy costs
    #: more than SDPA's strided read saves. A head-major pool is always read in place.
    copy_from = 256

    #: How many positions must have left every window before their window slots are released
    #: (``free_swa``) in one call: each call checks and rewrites the pool's full -> window table
    #: and cost about as much as a layer-step's attention, so releasing one position per decode
    #: step cost a sliding-window model about 2.5% of its decode time. A row holds at most this
    #: many window slots more than its window needs (the window side has a slot per token slot).
    window_release_batch = 32

    #: From how many positions per row a head-major pool's rows of a batch of several are
    #: gathered row by row into the result (below it, one gather and one copy cost less).
    gather_by_row_from = 64

    def __init__(
        self,
        layout: ModelLayout,
        pool: Any,
        allocator: Any,
        pool_name: str,
        page_size: int = 1,
    ) -> None:
        if pool.dtype != layout.dtype:
            raise PoolDtypeError(
                f"pool {pool_name!r} stores {pool.dtype} but the model computes in "
                f"{layout.dtype}; kvcache does not cast (a cast would change the logits)"
            )
        self.layout = layout
        self.pool = pool
        self.allocator = allocator
        self.pool_name = pool_name
        self.page_size = page_size
        requests = getattr(allocator, "mamba_allocator", None)
        has_state = bool(layout.of_kind(LayerKind.MAMBA))
        if has_state and not isinstance(requests, MambaSlotAllocator):
            raise MissingCapabilityError(
                f"pool {pool_name!r}'s allocator has no `mamba_allocator` handing out request "
                "slots, which the model's Mamba layers need"
            )
        self.rows = RowSlots(allocator, page_size, requests if has_state else None)
        windowed = bool(layout.of_kind(LayerKind.FULL)) and hasattr(
            pool, "translate_loc_from_full_to_swa"
        )
        if windowed and not isinstance(allocator, SWAAllocator):
            raise MissingCapabilityError(
                f"pool {pool_name!r} keeps a window side but its allocator cannot release "
                "window slots (free_swa)"
            )
        self._windowed = windowed and bool(layout.of_kind(LayerKind.SLIDING))
        self._window_freed = 0
        #: The last ``window_slots`` answer and what it was for: (lo, hi, table version).
        self._window_read: tuple[tuple[int, int, int], torch.Tensor] | None = None
        layers: list[Any] = []
        for plan in layout.layers:
            if plan.kind is LayerKind.FULL:
                layers.append(PoolAttentionLayer(plan, self))
            elif plan.kind is LayerKind.SLIDING:
                layers.append(PoolSlidingLayer(plan, self, windowed_pool=self._windowed))
            elif plan.kind is LayerKind.MLA:
                layers.append(PoolLatentLayer(plan, self))
            elif plan.kind is LayerKind.MAMBA:
                layers.append(StagedStateLayer(plan, self))
            else:  # caches nothing: transformers' own placeholder, as in its DynamicCache
                layers.append(DummyLayer())
        super().__init__(layers=layers)
        self._sliding = [layer for layer in layers if isinstance(layer, PoolSlidingLayer)]
        self._handles: dict[int, RetractedRow] = {}
        #: Rows retracted so far, and the bytes their snapshots held.
        self.retractions = 0
        self.bytes_offloaded = 0

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def for_model(
        cls,
        model: Any,
        pool: str | None = None,
        *,
        size: int,
        page_size: int = 1,
        registry: Registry | None = None,
        max_batch: int = 8,
    ) -> KVPoolCache:
        """A cache for ``model`` on the pool ``pool`` (or one chosen by capabilities).

        The model's layers are probed with one token through transformers' own cache, then
        mapped to a pool kind: full attention only -> an MHA-kind pool; sliding + full -> a
        ``sliding-window`` pool (window layers on its window side); an MLA latent -> an ``mla``
        pool; full attention + Mamba -> a ``mamba-state`` pool (layers that cache nothing keep
        transformers' ``DummyLayer``). ``pool`` may name any accepted
        pool, a third-party plugin's included, and is held to the capabilities the model needs.

        :param model: A transformers causal LM, already in its dtype and on its device.
        :param pool: An accepted pool's name; None chooses one by capabilities.
        :param size: Token slots (every row's prompt and generated tokens, padding included).
        :param page_size: Slots per page; ``> 1`` needs a ``paged`` allocator.
        :param registry: Where to find pools; default ``kvcache_core.discover()``.
        :param max_batch: Request slots for Mamba state (rows of one batch).
        :raises UnsupportedLayerError: A layer no pool kind serves, named.
        :raises MissingCapabilityError: The pool lacks a capability the model needs.
        :raises UnknownPoolError: ``pool`` is not an accepted pool.
        :raises PoolDtypeError: The built pool stores another dtype than the model's.
        :raises ValueError: ``size``/``page_size``/``max_batch`` is not a positive int.
        """
        for name, value in (("size", size), ("page_size", page_size), ("max_batch", max_batch)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"KVPoolCache.for_model: {name} must be a positive int")
        if registry is None:
            registry = discover()
        layout = probe_layout(model)
        choice = required_capabilities(layout, page_size)
        name = choose_pool_for_layout(registry, pool, choice)
        config = pool_config(
            layout, size=size, page_size=page_size, max_batch=max_batch, device=layout.device
        )
        built, allocator = registry.create(name, config)
        return cls(layout, built, allocator, name, page_size)

    # -- what the layers call ----------------------------------------------------------------
    def positions(self, layer_length: int, key_states: torch.Tensor) -> None:
        """Allocate this forward pass's slots when a layer first needs them.

        Called by every attention layer's ``update``; the first one of a forward pass (the one
        whose positions run past what the rows hold) allocates for every row at once, after
        releasing the window slots that no window can reach any more.
        """
        rows = self.rows
        batch, count = key_states.shape[0], key_states.shape[2]
        if layer_length + count <= rows.length and batch == rows.batch and rows.all_live:
            return  # a later layer of this forward pass: its slots are allocated
        if not rows.bound:
            rows.bind(batch)
        if batch != rows.batch:
            raise RowStateError(
                f"a forward pass with {batch} rows; this cache holds {rows.batch} (one cache "
                "serves one batch: call release() first)"
            )
        missing = layer_length + count - rows.length
        if missing > 0:
            if self._windowed:
                self._release_window()
            rows.extend(missing)
            if self._windowed:  # the window slots the new tokens got, translated once
                window = self.pool.translate_loc_from_full_to_swa(rows.last_loc)
                rows.last_window_loc = KVWriteLoc(rows.last_loc, window)
        else:
            rows.check_live()

    def _release_window(self) -> None:
        """``free_swa`` the positions that every window layer has left behind, once at least
        ``window_release_batch`` of them have (whole pages when paged)."""
        keep_from = min(layer.length - (layer.window - 1) for layer in self._sliding)
        # A paged window side frees whole pages: only pages every position of which has left.
        keep_from -= keep_from % self.page_size
        if keep_from - self._window_freed < self.window_release_batch:
            return
        rows = self.rows
        self.allocator.free_swa(rows.table[:, self._window_freed : keep_from].reshape(-1))
        self._window_freed = keep_from

    def window_slots(self, lo: int, hi: int) -> torch.Tensor:
        """The window-side slots of positions ``lo..hi`` of every row (row-major, flattened),
        translated through the pool's full -> window table once per forward pass: every window
        layer of a pass reads the same positions."""
        key = (lo, hi, self.rows.version)
        found = self._window_read
        if found is not None and found[0] == key:
            return found[1]
        full = self.rows.table[:, lo:hi].reshape(-1)
        window: torch.Tensor = self.pool.translate_loc_from_full_to_swa(full)
        self._window_read = (key, window)
        return window

    def heads_of(
        self, buffer: torch.Tensor, lo: int, hi: int, slots: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Positions ``lo..hi`` of every row from a pool buffer, head-major:
        ``[batch, heads, hi - lo, dim]``, each (row, head) block contiguous.

        One copy out of the pool's ``[slots, heads, dim]`` rows, the same bytes
        ``DynamicCache`` copies when it concatenates: attention kernels stream a head's keys
        from contiguous memory (reading them in place, strided by the other heads, measured
        2-3x slower in SDPA at a 2,048-token context). A one-row batch on consecutive slots
        copies a slice; otherwise the rows' slots are gathered. ``slots`` overrides the slots
        (a window side's own slots). A single-head buffer on consecutive slots (an MLA
        latent), or fewer than ``copy_from`` positions on consecutive slots, is returned as a
        view, with no copy at all.
        """
        rows = self.rows
        by_head = buffer.transpose(0, 1)
        # Each head's slots contiguous: a head-major pool, or one head (an MLA latent, MQA).
        head_major = by_head.stride(1) == by_head.shape[-1]
        start = rows.run_start
        if slots is None and start is not None:
            run = by_head[:, start + lo : start + hi].unsqueeze(0)
            # Head-major: the slice already is what attention wants, read in place. Short
            # contexts are too (a copy there costs more than the strided read).
            if head_major or hi - lo < self.copy_from:
                return run
            return run.contiguous()
        index = rows.table[:, lo:hi].reshape(-1) if slots is None else slots
        batch, count = rows.batch, hi - lo
        if not head_major:
            # A row-major pool: whole token rows gathered, then one copy into attention's
            # layout (measured faster than gathering along the strided slot dimension).
            got = buffer.index_select(0, index)
            return got.view(batch, count, *got.shape[1:]).transpose(1, 2).contiguous()
        if batch == 1 or count < self.gather_by_row_from:
            got = by_head.index_select(1, index)
            heads = got.view(got.shape[0], batch, count, *got.shape[2:]).transpose(0, 1)
            # Several rows: contiguous [batch, heads, positions, dim], as DynamicCache's
            # concatenation is. Eager attention flattens batch and heads with ``view`` (which a
            # batch-strided tensor refuses) and its batched matmul rounds differently on other
            # strides.
            return heads if batch == 1 else heads.contiguous()
        # Longer rows: each row's slots gathered straight into its [heads, positions, dim]
        # block of the contiguous result, one pass instead of a gather and a copy.
        out = by_head.new_empty((batch, by_head.shape[0], count, *by_head.shape[2:]))
        for row, row_slots in enumerate(index.view(batch, count)):
            torch.index_select(by_head, 1, row_slots, out=out[row])
        return out

    # -- retraction --------------------------------------------------------------------------
    def _state_layers(self) -> list[StagedStateLayer]:
        return [layer for layer in self.layers if isinstance(layer, StagedStateLayer)]

    def _check_row(self, row: object) -> int:
        if not isinstance(row, int) or isinstance(row, bool):
            raise RowStateError(f"row must be an int, got {type(row).__name__}")
        if not self.rows.bound:
            raise RowStateError("no forward pass has run: the cache holds no rows yet")
        if not 0 <= row < self.rows.batch:
            raise RowStateError(f"row {row} is out of range (the batch has {self.rows.batch})")
        return row

    def _request_slot(self, row: int) -> torch.Tensor | None:
        slots = self.rows.request_slots
        return None if slots is None else slots[row : row + 1].clone()

    def retract(self, row: int) -> RetractedRow:
        """Offload ``row`` to the host and free its slots; legal between forward passes.

        The row's Mamba state (if any) is copied from staging into its request slot first, then
        the allocator's ``get_cpu_copy(slots, mamba_indices=request_slot)`` takes the snapshot,
        the row's staged state is zeroed (the snapshot is now its only copy), and the token
        slots (and request slot) are freed. The next forward pass refuses to run
        until the row is resumed.

        :raises RowStateError: ``row`` is out of range or already retracted.
        """
        row = self._check_row(row)
        rows = self.rows
        if not rows.live[row]:
            raise RowStateError(f"row {row} is already retracted")
        slots = rows.row_slots(row)
        request = self._request_slot(row)
        if request is not None:
            for layer in self._state_layers():
                layer.store_row(row, request)
        snapshot = self.allocator.get_cpu_copy(slots, mamba_indices=request)
        for layer in self._state_layers():
            layer.forget_row(row)
        if slots.numel():
            self.allocator.free(slots)
        if request is not None and rows.requests is not None:
            rows.requests.free(request)
        rows.live[row] = False
        rows.run_start = None
        handle = RetractedRow(next(_handle_ids), row, rows.length, snapshot, slots, request)
        self._handles[handle.id] = handle
        self.retractions += 1
        self.bytes_offloaded += handle.nbytes
        return handle

    def resume(self, row: int, handle: RetractedRow) -> None:
        """Load ``handle`` back into newly allocated slots of ``row`` (retracted, same batch).

        New token slots (and a new request slot) are allocated, the allocator's
        ``load_cpu_copy`` writes the snapshot there, and the row's Mamba state is restored
        from its new request slot into staging. Nothing is allocated or written when a check
        fails, and a failed allocation gives back what it took.

        :raises UnknownHandleError: ``handle`` is not one this cache handed out (or was used).
        :raises RowStateError: ``row`` is out of range or live.
        :raises OutOfSlotsError: Too few free slots (how many are needed and free is named).
        """
        row = self._check_row(row)
        if not isinstance(handle, RetractedRow) or self._handles.get(handle.id) is not handle:
            raise UnknownHandleError(
                "resume needs a handle this cache's retract returned, not yet resumed"
            )
        rows = self.rows
        if rows.live[row]:
            raise RowStateError(f"row {row} is live: resume only into a retracted row")
        if handle.length != rows.length:
            raise RowStateError(
                f"the handle holds {handle.length} positions; the batch is at {rows.length}"
            )
        slots = rows.take_row(row)
        request: torch.Tensor | None = None
        try:
            if rows.requests is not None:
                got = rows.requests.alloc(1)
                if got is None:
                    raise OutOfSlotsError(
                        f"resuming row {row} needs 1 Mamba request slot; none is free"
                    )
                request = got.to(rows.device, torch.int64).reshape(-1)
            self.allocator.load_cpu_copy(handle.snapshot, slots, mamba_indices=request)
        except BaseException:
            if slots.numel():
                self.allocator.free(slots)
            if request is not None and rows.requests is not None:
                rows.requests.free(request)
            raise
        if request is not None and rows.request_slots is not None:
            rows.request_slots[row] = request[0]
            for layer in self._state_layers():
                layer.load_row(row, request)
        rows.place_row(row, slots)
        del self._handles[handle.id]

    # -- housekeeping ------------------------------------------------------------------------
    def flush_state(self) -> None:
        """Copy every live row's staged Mamba state into its request slot in the pool."""
        slots = self.rows.request_slots
        if slots is None:
            return
        for row, live in enumerate(self.rows.live):
            if live:
                for layer in self._state_layers():
                    layer.store_row(row, slots[row : row + 1])

    def row_slots(self, row: int) -> torch.Tensor:
        """The token slots ``row`` holds now, position by position (a copy)."""
        return self.rows.row_slots(self._check_row(row))

    def release(self) -> None:
        """Free every slot this cache holds and forget its rows; the cache is empty after."""
        self.rows.release()
        self._window_freed = 0
        self._handles.clear()
        for layer in self.layers:
            layer.reset()

    def reset(self) -> None:
        """transformers' reset: here the same as ``release`` (slots go back to the pool)."""
        self.release()

    @property
    def is_compileable(self) -> bool:
        """Never: the slot table changes shape every step."""
        return False
