"""The pool contract (version 2) and its optional capabilities, as ``typing.Protocol``s.

Why Protocols and not an abstract base class: third-party pools must not have to inherit from
kvcache to be checked, and mypy can then tell a pool author, member by member, where their
class drifted. Every method here is the single source of truth that the checker, discovery and
``history`` are tested against.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from .snapshot import KVSnapshot
from .writeloc import KVWriteLoc

__all__ = [
    "HiSparsePool",
    "IndexerKeyPool",
    "KVPool",
    "LayerLike",
    "MLAPool",
    "MambaStatePool",
    "OffloadablePool",
    "SlidingWindowPool",
]


@runtime_checkable
class LayerLike(Protocol):
    """Anything that tells a pool which layer it is: an attention module, or a tiny record."""

    @property
    def layer_id(self) -> int:
        """The global layer id (a pool that holds layers from ``start_layer`` subtracts it)."""
        ...


@runtime_checkable
class KVPool(Protocol):
    """Every pool. Buffers have ``size + page_size`` rows; slot 0 is a reserved padding slot."""

    size: int
    """Usable token slots (the ids allocators hand out); buffers have ``size + page_size``
    rows."""
    page_size: int
    """Slots per page; page 0 (slot 0 and the rest of its page) is never handed out."""
    dtype: torch.dtype
    """The compute dtype kernels read and writes are cast to."""
    device: torch.device
    """Where the buffers live."""
    layer_num: int
    """How many layers this pool holds (from its ``start_layer``, when it has one)."""

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """The key buffer of ``layer_id`` (``size + page_size`` rows), as kernels index it.

        A view, not a copy: attention kernels read and write it in place. An id the pool does
        not hold raises [`InvalidLayerError`][kvcache_core.InvalidLayerError].
        """
        ...

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """The value buffer of ``layer_id``; like ``get_key_buffer`` (MLA: a view of the key)."""
        ...

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(get_key_buffer(layer_id), get_value_buffer(layer_id))`` in one call."""
        ...

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Write one forward pass's keys and values of ``layer`` at ``loc``.

        ``loc`` is a slot tensor or a [`KVWriteLoc`][kvcache_core.KVWriteLoc]; a pool unwraps
        it with [`unwrap_write_loc`][kvcache_core.unwrap_write_loc] (indexing a buffer with the
        record itself is the bug that motivated the record's check). ``cache_k``/``cache_v``
        hold one row per slot; ``k_scale``/``v_scale`` divide the values before an fp8 pool
        stores them. Bad slots or shapes raise before any row is written.
        """
        ...

    def get_kv_size_bytes(self) -> int:
        """Bytes of every per-token-slot buffer the pool allocates, each storage counted once.

        What engines size their memory budget with, so views of one storage count once and
        Mamba request state, slot tables and allocator bookkeeping do not count (the contract
        page spells out the bounds the behaviour battery holds it to).
        """
        ...


@runtime_checkable
class OffloadablePool(KVPool, Protocol):
    """Retraction support: copy slots to the host and load them back into new slots."""

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        """Copy the rows of token slots ``indices`` (and request slots ``mamba_indices``, for
        pools with recurrent state) to the host, as a [`KVSnapshot`][kvcache_core.KVSnapshot].

        A copy, never a view: the slots are freed and reused right after a retraction.
        """
        ...

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        """Write ``snapshot`` back at newly allocated ``indices`` (same count, same order).

        A snapshot that does not fit this pool raises
        [`SnapshotMismatchError`][kvcache_core.SnapshotMismatchError] before any byte is
        written ([`expect_snapshot`][kvcache_core.expect_snapshot] does the checking).
        """
        ...


@runtime_checkable
class MLAPool(KVPool, Protocol):
    """Latent (multi-head latent attention) access: one ``[nope | rope]`` row per token.

    The key buffer of a layer is the whole latent, ``[rows, 1, kv_lora_rank + qk_rope_head_dim]``;
    the value buffer is a view of its first ``kv_lora_rank`` columns (MLA has no separate V).
    ``set_mla_kv_buffer`` takes the two halves and stores their concatenation;
    ``get_mla_kv_buffer`` returns them split again, copied, in ``dst_dtype`` (default the pool's).
    """

    kv_lora_rank: int
    """Width of the latent's "nope" part, which the value buffer views."""
    qk_rope_head_dim: int
    """Width of the latent's rope part, after the nope part."""

    def set_mla_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        """Store ``[cache_k_nope | cache_k_rope]`` as the latent row of each slot of ``loc``."""
        ...

    def get_mla_kv_buffer(
        self,
        layer: LayerLike,
        loc: torch.Tensor,
        dst_dtype: torch.dtype | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(nope, rope)`` halves of the rows at ``loc``, copied, in ``dst_dtype``."""
        ...


@runtime_checkable
class IndexerKeyPool(KVPool, Protocol):
    """DSA's per-layer indexer keys and scales, stored by page of ``page_size`` tokens.

    Slot ``s`` sits in page ``s // page_size`` at offset ``s % page_size``. Per token the pool
    keeps an ``index_head_dim`` key in ``index_dtype`` (fp8 is stored as uint8) and one float32
    scale; the setter and getter address tokens by slot, whatever the page layout.
    """

    index_head_dim: int
    """Width of one token's indexer key."""
    index_dtype: torch.dtype
    """The dtype indexer keys are stored in (fp8 kept as uint8)."""

    def set_index_k_scale_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        index_k: torch.Tensor,
        index_k_scale: torch.Tensor,
    ) -> None:
        """Store each slot's indexer key and its float32 scale, wherever its page lies."""
        ...

    def get_index_k_scale_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(index_k, index_k_scale)`` of the slots ``loc``, as stored."""
        ...


@runtime_checkable
class SlidingWindowPool(KVPool, Protocol):
    """A full pool plus a window pool; full slots translate to window slots through a table.

    ``swa_layer_ids`` are global layer ids; every other layer is a full-attention layer. The
    table (``[size + page_size + 1]`` int64, 0 = "no window slot", last entry -1 so that a
    ``last_loc`` of -1 translates to -1) is owned by the allocator and registered here. Window
    layers write at ``KVWriteLoc.swa_loc``, or at the translated ``loc`` when it is None. A
    snapshot holds the full rows of every index and the window rows of the indices that still
    had a window slot; loading needs those tokens to have window slots again (the allocator's
    ``load_cpu_copy`` re-creates them).
    """

    swa_layer_ids: tuple[int, ...]
    """Global ids of the sliding-window layers; every other layer is a full layer."""

    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        """Adopt the allocator's full -> window table (shared, not copied: it changes live)."""
        ...

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """The window slots of full slots ``kv_indices`` (0 where a token has none)."""
        ...


@runtime_checkable
class MambaStatePool(Protocol):
    """Per-request recurrent state, indexed by request slot (slot 0 is padding).

    ``mamba_layer_ids`` and ``get_mamba_state``'s ``layer_id`` are global layer ids; the state
    is ``(conv states, temporal state)``, each ``[slots + 1, *shape]``. In ``get_cpu_copy`` and
    ``load_cpu_copy`` the request slots travel as ``mamba_indices`` (``indices`` stay token
    slots). A snapshot taken with ``mamba_indices=None`` carries no state and says so in its
    meta; loading must then also pass None, and a snapshot with state needs ``mamba_indices``.
    """

    mamba_layer_ids: tuple[int, ...]
    """Global ids of the layers with recurrent state (they have no KV buffers)."""

    def get_mamba_state(self, layer_id: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """``(conv states, temporal state)`` of global layer ``layer_id``, as kernels use them."""
        ...

    def clear_slots(self, indices: torch.Tensor) -> None:
        """Zero the state of request slots ``indices``, so a new request starts clean."""
        ...

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the state of request slots ``src`` to ``dst`` (forking a request's prefix)."""
        ...


@runtime_checkable
class HiSparsePool(KVPool, Protocol):
    """A large logical store of which a subset of slots is resident on the device.

    ``size`` counts *logical* slots: the ids allocators hand out and every ``loc``/``indices``
    argument names. ``device_size`` counts device slots; the kernel-facing buffers
    (``get_key_buffer`` ...) are indexed by device slot, found with ``translate_loc_to_device``
    (-1 = not resident). The logical -> device table is owned by the allocator and registered
    with the pool (``[size + page_size + 1]`` int64, last entry -1 so that -1 translates to -1).
    ``load_to_device`` copies logical rows into device slots and records them in the table.
    """

    device_size: int
    """Device slots: how many logical slots can be resident at once."""

    def register_logical_to_device(self, logical_to_device: torch.Tensor) -> None:
        """Adopt the allocator's logical -> device table (shared, not copied)."""
        ...

    def translate_loc_to_device(self, loc: torch.Tensor) -> torch.Tensor:
        """The device slots of logical slots ``loc`` (-1 where a slot is not resident)."""
        ...

    def load_to_device(self, logical: torch.Tensor, device_slots: torch.Tensor) -> None:
        """Copy logical rows ``logical`` into ``device_slots`` and record them in the table."""
        ...
