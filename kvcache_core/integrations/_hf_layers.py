"""The per-layer objects a [`KVPoolCache`][kvcache_core.integrations.transformers.KVPoolCache]
hands transformers: each writes into and reads from a kvcache pool instead of its own tensors.

Each class mirrors the transformers layer it stands in for exactly (what ``update`` returns,
``get_mask_sizes``, the padding of a first conv state), because "generation continues exactly
as if nothing happened" means bit-identical logits, and those depend on every returned shape.

Mamba state is *staged*: transformers' Mamba kernels update conv and recurrent state in place,
on a ``[batch, ...]`` tensor, and a batch's request slots in the pool are generally not one
strided block, so no view of the pool can be that tensor. The layer keeps the batch's state in
its own tensor (as transformers does) and the cache copies a row's state into the pool's
request slot before any offload, and back after a resume; the pool is the truth whenever a row
is offloaded or restored, the staging tensor in between.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin

from ..errors import ShapeMismatchError
from ._hf_layout import LayerPlan

if TYPE_CHECKING:
    from ._hf_rows import RowSlots

__all__ = ["PoolAttentionLayer", "PoolLatentLayer", "PoolSlidingLayer", "StagedStateLayer"]


@dataclass(frozen=True)
class LayerRef:
    """What a pool's ``set_kv_buffer`` is told the layer is: its global id."""

    layer_id: int


class Owner(Protocol):
    """The cache, as its layers see it: shared slots and the pool."""

    rows: RowSlots
    pool: Any

    def positions(self, layer_length: int, key_states: torch.Tensor) -> None:
        """Make sure every row holds slots for ``layer_length`` + the new tokens."""
        ...

    def heads_of(
        self, buffer: torch.Tensor, lo: int, hi: int, slots: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Positions ``lo..hi`` of every batch row, head-major ``[B, heads, hi - lo, dim]``."""
        ...

    def window_slots(self, lo: int, hi: int) -> torch.Tensor:
        """The window-side slots of positions ``lo..hi`` of every row, row-major, flattened."""
        ...


def _token_rows(states: torch.Tensor) -> torch.Tensor:
    """``[batch, heads, tokens, dim]`` -> one ``[heads, dim]`` row per (batch row, token)."""
    if states.shape[2] == 1:
        return states.squeeze(2)  # a decode step: already row-major, no copy
    return states.transpose(1, 2).reshape(-1, states.shape[1], states.shape[3])


class _Unsupported:
    """Cache operations transformers uses for search strategies the pool layers do not do."""

    def _refuse(self, what: str) -> None:
        raise NotImplementedError(
            f"KVPoolCache does not support {what} yet (beam search, assisted or contrastive "
            "decoding); use greedy or sampled generation"
        )

    def crop(self, tokens_to_remove: int) -> None:
        self._refuse("crop")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._refuse("reorder_cache")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse("batch_repeat_interleave")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._refuse("batch_select_indices")


class PoolAttentionLayer(_Unsupported, CacheLayerMixin):
    """A full-attention layer whose keys and values live in the pool (``DynamicLayer``'s role).

    ``update`` writes the new tokens at their slots and returns every cached position of every
    row, ``[batch, heads, positions, dim]``, copied head-major out of the pool (see
    ``KVPoolCache.heads_of``).
    """

    is_compileable = False
    is_croppable = False
    supports_early_init = False
    is_sliding = False
    #: Whether this layer writes on a pool's window side (at ``rows.last_window_loc``).
    window_side = False

    def __init__(self, plan: LayerPlan, owner: Owner) -> None:
        super().__init__()
        self.plan = plan
        self.owner = owner
        self.ref = LayerRef(plan.index)
        self.length = 0
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        #: The key and value buffers viewed head-major (``[1, heads, slots, dim]``), and whether
        #: each head's slots are contiguous there (a head-major pool, or one head).
        self._by_head: tuple[torch.Tensor, torch.Tensor, bool] | None = None
        #: The pool's write method for this layer kind, bound once: every layer-step calls it.
        self._store = self._pool_writer()

    def _pool_writer(self) -> Any:
        """The pool method that writes this layer's token rows (``set_kv_buffer`` here)."""
        return self.owner.pool.set_kv_buffer

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The pool's key and value buffers of this layer (views, looked up once)."""
        if self._buffers is None:
            self._buffers = self.owner.pool.get_kv_buffer(self.plan.index)
        return self._buffers

    def _check(self, states: torch.Tensor, heads: int, dim: int, name: str) -> None:
        pool_dtype = self.owner.pool.dtype
        if states.dim() != 4 or states.shape[1] != heads or states.shape[3] != dim:
            raise ShapeMismatchError(
                f"layer {self.plan.index}: {name} are {list(states.shape)}; the pool stores "
                f"[batch, {heads}, tokens, {dim}]"
            )
        if states.dtype != pool_dtype:
            raise ShapeMismatchError(
                f"layer {self.plan.index}: the model computes in {states.dtype} but the pool "
                f"stores {pool_dtype}; build the cache after moving the model to its dtype"
            )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens in the pool; return what ``DynamicLayer`` would return."""
        plan = self.plan
        k_shape, v_shape = key_states.shape, value_states.shape
        dtype = self.owner.pool.dtype
        if not (  # the common case in one test; the checks below name what is wrong
            len(k_shape) == 4
            and len(v_shape) == 4
            and k_shape[1] == plan.heads
            and k_shape[3] == plan.head_dim
            and v_shape[1] == plan.heads
            and v_shape[3] == plan.v_head_dim
            and key_states.dtype == dtype
            and value_states.dtype == dtype
        ):
            self._check(key_states, plan.heads, plan.head_dim, "keys")
            self._check(value_states, plan.heads, plan.v_head_dim, "values")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.length
        count = k_shape[2]
        rows = self.owner.rows
        if start + count == rows.length and count == rows.last_count and k_shape[0] == rows.batch:
            # A later layer of this forward pass (its slots are allocated, flattened once in
            # ``rows.last_loc``): the hot path, without the calls that would find that out.
            loc = rows.last_window_loc if self.window_side else rows.last_loc
        else:
            self.owner.positions(start, key_states)
            loc = self._loc(start, count)
        self._store(self.ref, loc, _token_rows(key_states), _token_rows(value_states))
        self.length = start + count
        return self._read(start, count)

    def _loc(self, start: int, count: int) -> torch.Tensor:
        rows = self.owner.rows
        if start + count == rows.length and count == rows.last_count:
            # this forward pass's slots, flattened (and translated) once for every layer
            return rows.last_window_loc if self.window_side else rows.last_loc
        return rows.table[:, start : start + count].reshape(-1)

    def _read(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        end = start + count
        run = self.owner.rows.run_start
        views = self._by_head
        if views is None:
            key, value = self.buffers()
            k_heads, v_heads = key.transpose(0, 1)[None], value.transpose(0, 1)[None]
            contiguous = all(t.stride(2) == t.shape[-1] for t in (k_heads, v_heads))
            views = self._by_head = (k_heads, v_heads, contiguous)
        if run is not None and views[2]:
            # The hot path of a one-row batch on a head-major pool: views, each head one
            # contiguous block, no copy (what ``heads_of`` would return, without its lookups).
            return views[0].narrow(2, run, end), views[1].narrow(2, run, end)
        key, value = self.buffers()
        return self.owner.heads_of(key, 0, end), self.owner.heads_of(value, 0, end)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length = 0
        self.is_initialized = False


class PoolSlidingLayer(PoolAttentionLayer):
    """A sliding-window layer (``DynamicSlidingWindowLayer``'s role).

    Returns the last ``window - 1`` cached positions plus the new ones. In a sliding-window
    pool its rows live on the window side, found through the pool's full -> window table; the
    cache releases the window slots of positions that left every window.
    """

    is_sliding = True

    def __init__(self, plan: LayerPlan, owner: Owner, *, windowed_pool: bool) -> None:
        super().__init__(plan, owner)
        self.window = plan.window
        self.windowed_pool = self.window_side = windowed_pool

    def _read(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        lo = max(0, start - (self.window - 1))
        end = start + count
        key, value = self.buffers()
        owner = self.owner
        window = None
        if self.windowed_pool:
            window = owner.window_slots(lo, end)
        return owner.heads_of(key, lo, end, window), owner.heads_of(value, lo, end, window)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        cumulative = self.length
        offset = max(cumulative - self.window + 1, 0)
        if cumulative >= self.window:
            return self.window - 1 + query_length, offset
        return cumulative + query_length, offset

    def get_max_length(self) -> int:
        return self.window


class PoolLatentLayer(PoolAttentionLayer):
    """An MLA layer caching the compressed latent: ``update(kv_nope, k_rope)``.

    transformers hands the latent as two single-head tensors (``[batch, 1, tokens, rank]`` and
    ``[batch, 1, tokens, rope]``); the pool stores their concatenation in one row per token and
    the read returns the two halves of the same rows.
    """

    def _pool_writer(self) -> Any:
        """The latent is written whole, one row per token, with ``set_mla_kv_buffer``."""
        return self.owner.pool.set_mla_kv_buffer

    def _read(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        latent = self.owner.heads_of(self.buffers()[0], 0, start + count)
        rank = self.plan.head_dim
        return latent[..., :rank], latent[..., rank:]


class StagedStateLayer(_Unsupported, LinearAttentionCacheLayerMixin):
    """A Mamba / linear-attention layer: ``LinearAttentionLayer``'s role, with the pool behind.

    The batch's conv and recurrent state are staged here (see the module docstring);
    [`store_row`][kvcache_core.integrations._hf_layers.StagedStateLayer.store_row] and
    [`load_row`][kvcache_core.integrations._hf_layers.StagedStateLayer.load_row] move one row
    to and from its request slot in the pool.
    """

    def __init__(self, plan: LayerPlan, owner: Owner) -> None:
        super().__init__(number_of_states=1)
        self.plan = plan
        self.owner = owner

    def _start(self, states: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
        """Check a first state against the pool's shape and bind the batch's rows."""
        want = self.plan.conv_shape if what == "conv" else self.plan.state_shape
        if shape != want:
            raise ShapeMismatchError(
                f"layer {self.plan.index}: {what} state is {list(shape)} per request; "
                f"the pool stores {list(want)}"
            )
        if not self.owner.rows.bound:
            self.owner.rows.bind(states.shape[0])
        if states.shape[0] != self.owner.rows.batch:
            raise ShapeMismatchError(
                f"layer {self.plan.index}: a batch of {states.shape[0]} rows; this cache holds "
                f"{self.owner.rows.batch}"
            )
        self.owner.rows.check_live()

    def lazy_initialization(
        self,
        conv_states: torch.Tensor | None = None,
        recurrent_states: torch.Tensor | None = None,
        state_idx: int = 0,
        conv_kernel_size: int | None = None,
    ) -> None:
        if conv_states is not None:
            self.dtype, self.device = conv_states.dtype, conv_states.device
            kernel = conv_states.shape[-1] if conv_kernel_size is None else conv_kernel_size
            self.conv_kernel_size[state_idx] = kernel
            self.conv_states[state_idx] = conv_states.new_zeros((*conv_states.shape[:-1], kernel))
            self.is_conv_states_initialized[state_idx] = True
        if recurrent_states is not None:
            self.recurrent_states[state_idx] = torch.zeros_like(recurrent_states)
            self.is_recurrent_states_initialized[state_idx] = True

    def update_conv_state(
        self,
        conv_states: torch.Tensor,
        state_idx: int = 0,
        conv_kernel_size: int | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Stage the new conv state (padded or cut to the kernel); return the full window."""
        if not self.is_conv_states_initialized[state_idx]:
            kernel = conv_states.shape[-1] if conv_kernel_size is None else conv_kernel_size
            self._start(conv_states, (*conv_states.shape[1:-1], kernel), "conv")
            self.lazy_initialization(conv_states=conv_states, conv_kernel_size=conv_kernel_size)
        staged: torch.Tensor | None = self.conv_states[state_idx]
        assert staged is not None
        kernel = self.conv_kernel_size[state_idx]
        if not self.has_previous_state[state_idx]:
            full = conv_states
            self.has_previous_state[state_idx] = True
            if full.shape[-1] < kernel:
                full = torch.nn.functional.pad(full, (kernel - full.shape[-1], 0), value=0)
        else:
            full = torch.cat([staged, conv_states], dim=-1)
        staged.copy_(full[..., -kernel:])
        return full

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        """Stage the new recurrent state (copied in place, as transformers does)."""
        if not self.is_recurrent_states_initialized[state_idx]:
            self._start(recurrent_states, tuple(recurrent_states.shape[1:]), "recurrent")
            self.lazy_initialization(recurrent_states=recurrent_states)
        staged: torch.Tensor | None = self.recurrent_states[state_idx]
        assert staged is not None
        staged.copy_(recurrent_states)
        return staged

    def _pool_state(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The pool's conv state (None when the layer keeps none) and temporal state."""
        conv, temporal = self.owner.pool.get_mamba_state(self.plan.index)
        return (conv[0] if conv else None), temporal

    def store_row(self, row: int, slot: torch.Tensor) -> None:
        """Copy ``row``'s staged state into request slot ``slot`` of the pool."""
        conv, temporal = self._pool_state()
        staged_conv, staged_state = self.conv_states[0], self.recurrent_states[0]
        if staged_conv is not None and conv is not None:
            conv[slot] = staged_conv[row : row + 1].to(conv.dtype)
        if staged_state is not None:
            temporal[slot] = staged_state[row : row + 1].to(temporal.dtype)

    def forget_row(self, row: int) -> None:
        """Zero ``row``'s staged state: once offloaded, the pool's snapshot is its only copy."""
        for staged in (self.conv_states[0], self.recurrent_states[0]):
            if staged is not None:
                staged[row].zero_()

    def load_row(self, row: int, slot: torch.Tensor) -> None:
        """Copy request slot ``slot``'s state from the pool into ``row``'s staged state."""
        conv, temporal = self._pool_state()
        staged_conv, staged_state = self.conv_states[0], self.recurrent_states[0]
        if staged_conv is not None and conv is not None:
            staged_conv[row : row + 1] = conv[slot].to(staged_conv.dtype)
        if staged_state is not None:
            staged_state[row : row + 1] = temporal[slot].to(staged_state.dtype)

    def reset(self) -> None:
        for i in range(self.number_of_states):
            self.conv_states[i] = None
            self.recurrent_states[i] = None
            self.is_conv_states_initialized[i] = False
            self.is_recurrent_states_initialized[i] = False
            self.has_previous_state[i] = False
