"""The ``mamba`` plugin: a hybrid model's attention layers (token KV) and Mamba layers (state).

A hybrid model (attention layers interleaved with Mamba layers) needs two kinds of memory: token
slots for the attention layers, held by an MHA pool that stores only those layers, and request
slots for the Mamba layers' recurrent state, held by a `MambaPool`. The hybrid pool maps
each global layer id to the one that holds it. The Mamba pool is passed in, not built here, so
that an engine's request-to-token pool (which hands out the request slots) and this pool share
one state store.

Retraction must carry the state too, or a resumed request continues from a wrong recurrence.
Hence the offload rule (see `HybridMambaKVPool.get_cpu_copy` and docs/pools/mamba.md):
``mamba_indices`` given -> the snapshot carries those request slots' state; ``None`` -> it
carries none and says so, and loading refuses any call that does not match what was saved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from kvcache_core import (
    Capability,
    InvalidLayerError,
    KVPool,
    KVSnapshot,
    KVWriteLoc,
    LayerLike,
    PagedSlotAllocator,
    PoolConfig,
    PoolSpec,
    SnapshotMismatchError,
    check_slots,
    expect_snapshot,
    hookimpl,
)

from ._layers import head_major_option, layer_id_of
from ._mamba_state import MambaPool, MambaSlotAllocator
from .mha import MHATokenToKVPool

__all__ = [
    "CheckedHybridSnapshot",
    "HybridMambaAllocator",
    "HybridMambaKVPool",
    "MambaPool",
    "MambaSlotAllocator",
    "create",
    "kvcache_pool_specs",
]

_CHILDREN = ("attention", "mamba")


@dataclass(frozen=True)
class _SubLayer:
    """The layer the attention sub-pool sees: its own local id."""

    layer_id: int


class CheckedHybridSnapshot(NamedTuple):
    """A hybrid snapshot checked against its new indices; nothing written yet."""

    slots: torch.Tensor
    attention: KVSnapshot
    mamba_slots: torch.Tensor | None
    mamba: KVSnapshot | None


class HybridMambaKVPool:
    """Attention layers in an MHA token pool, Mamba layers in a (shared) request-state pool.

    ``size``, ``page_size`` and ``dtype`` describe the attention token pool; ``layer_num``
    counts every layer of the model. ``get_kv_size_bytes`` counts the attention KV only: the
    state store is shared with the request pool and accounted for there. ``head_major`` keeps
    the attention rows head-major in memory (as ``MHATokenToKVPool`` does; the Mamba state is
    per request, not per token, and has no heads-by-slots layout to choose).
    """

    kind = "mamba"
    #: get_cpu_copy(..., mamba_indices=slots) puts those slots' state in the snapshot.
    snapshot_carries_mamba_state = True

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        mamba_pool: MambaPool,
        device: torch.device | str = "cpu",
        *,
        v_head_dim: int | None = None,
        start_layer: int = 0,
        check_write_slots: bool | None = None,
        head_major: bool = False,
    ) -> None:
        every = range(start_layer, start_layer + layer_num)
        ids = mamba_pool.mamba_layer_ids
        if any(i not in every for i in ids):
            raise ValueError(
                f"mamba_layer_ids {list(ids)} must lie in "
                f"{start_layer}..{start_layer + layer_num - 1}"
            )
        attention = tuple(i for i in every if i not in ids)
        if not attention:
            raise ValueError("a hybrid pool needs at least one attention layer")
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.device = torch.device(device)
        self.layer_num = layer_num
        self.start_layer = start_layer
        self.mamba_layer_ids = ids
        self.attention_layer_ids = attention
        self.mamba_pool = mamba_pool
        self.head_major = head_major
        self.attention_pool = MHATokenToKVPool(
            size,
            page_size,
            dtype,
            head_num,
            head_dim,
            len(attention),
            self.device,
            v_head_dim=v_head_dim,
            check_write_slots=check_write_slots,
            head_major=head_major,
        )
        self._attention_local = {g: i for i, g in enumerate(attention)}

    # -- layers -------------------------------------------------------------------------------
    def _local(self, layer_id: int) -> int:
        local = self._attention_local.get(layer_id)
        if local is not None:
            return local
        if layer_id in self.mamba_layer_ids:
            raise InvalidLayerError(
                f"layer {layer_id} is a Mamba layer: it has no KV buffers, use "
                "get_mamba_state(layer_id)"
            )
        raise InvalidLayerError(
            f"layer {layer_id} is not in this pool (it holds layers "
            f"{self.start_layer}..{self.start_layer + self.layer_num - 1})"
        )

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.attention_pool.get_key_buffer(self._local(layer_id))

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.attention_pool.get_value_buffer(self._local(layer_id))

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.attention_pool.get_kv_buffer(self._local(layer_id))

    def get_kv_size_bytes(self) -> int:
        return self.attention_pool.get_kv_size_bytes()

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Write an attention layer; the location goes to the attention pool unchanged."""
        local = self._local(layer_id_of(layer))
        self.attention_pool.set_kv_buffer(_SubLayer(local), loc, cache_k, cache_v, k_scale, v_scale)

    # -- Mamba state --------------------------------------------------------------------------
    def get_mamba_state(self, layer_id: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        return self.mamba_pool.get_mamba_state(layer_id)

    def clear_slots(self, indices: torch.Tensor) -> None:
        self.mamba_pool.clear_slots(indices)

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self.mamba_pool.copy_slots(src, dst)

    # -- offload ------------------------------------------------------------------------------
    def _meta(self) -> dict[str, object]:
        return {
            "layer_num": self.layer_num,
            "start_layer": self.start_layer,
            "mamba_layer_ids": self.mamba_layer_ids,
        }

    def _token_slots(self, indices: torch.Tensor) -> torch.Tensor:
        return check_slots(
            indices, limit=self.attention_pool.rows, allow_duplicates=False, device=self.device
        )

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        """Copy the attention KV at token slots ``indices`` and the state at ``mamba_indices``.

        With ``mamba_indices=None`` the snapshot carries no state (``meta["mamba_state"]`` is
        False, child ``mamba`` is None): the caller keeps the state itself. It is not an error,
        because an engine may save state on its own path, but it is recorded so that loading
        can refuse a call that does not match (see `load_cpu_copy`).
        """
        slots = self._token_slots(indices)
        state: KVSnapshot | None = None
        if mamba_indices is not None:
            requests = self.mamba_pool.check_request_slots(mamba_indices)
            state = self.mamba_pool.get_cpu_copy(requests)
        return KVSnapshot(
            pool_kind=self.kind,
            dtype=self.dtype,
            token_count=slots.numel(),
            parts={},
            children={"attention": self.attention_pool.get_cpu_copy(slots), "mamba": state},
            meta={**self._meta(), "mamba_state": state is not None},
        )

    def check_cpu_copy(
        self,
        snapshot: object,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> CheckedHybridSnapshot:
        """Check a snapshot against new token and request slots without writing anything."""
        slots = self._token_slots(indices)
        snap = expect_snapshot(
            snapshot,
            kind=self.kind,
            dtype=self.dtype,
            token_count=slots.numel(),
            parts={},
            meta=self._meta(),
        )
        if set(snap.children) != set(_CHILDREN):
            raise SnapshotMismatchError(
                f"snapshot has children {sorted(snap.children)}; a hybrid Mamba snapshot has "
                f"{list(_CHILDREN)}"
            )
        state = snap.children["mamba"]
        if snap.meta.get("mamba_state") is not (state is not None):
            raise SnapshotMismatchError(
                f"snapshot meta mamba_state={snap.meta.get('mamba_state')!r} disagrees with its "
                f"{'missing' if state is None else 'present'} 'mamba' child"
            )
        attention = self.attention_pool.check_snapshot(snap.children["attention"], slots.numel())
        if state is None:
            if mamba_indices is not None:
                raise SnapshotMismatchError(
                    "snapshot carries no Mamba state (it was taken with mamba_indices=None, so "
                    "the caller kept the state); load it with mamba_indices=None and restore "
                    "the state the way it was saved"
                )
            return CheckedHybridSnapshot(slots, attention, None, None)
        if mamba_indices is None:
            raise SnapshotMismatchError(
                f"snapshot carries the Mamba state of {state.token_count} request slot(s); pass "
                "their new slots as mamba_indices (loading without them would lose the state)"
            )
        requests = self.mamba_pool.check_request_slots(mamba_indices)
        return CheckedHybridSnapshot(
            slots, attention, requests, self.mamba_pool.check_snapshot(state, requests.numel())
        )

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        """Restore KV at the new token slots and state at the new request slots.

        ``mamba_indices`` must be given exactly when the snapshot carries state (else
        `SnapshotMismatchError`, before any write): silently dropping saved state, or
        "restoring" state that was never saved, both resume a request from a wrong recurrence.
        """
        checked = self.check_cpu_copy(snapshot, indices, mamba_indices)
        # checked once, above: each part is written as checked, never checked again
        self.attention_pool.load_checked(checked.attention, checked.slots)
        if checked.mamba is not None and checked.mamba_slots is not None:
            self.mamba_pool.load_checked(checked.mamba, checked.mamba_slots)


class HybridMambaAllocator(PagedSlotAllocator):
    """Token (or page) slots for the attention layers, plus ``mamba_allocator`` for requests.

    The token side is a plain `PagedSlotAllocator`, whose offload calls forward every
    argument (``mamba_indices`` included) to the pool. Request slots have their own lifecycle
    (one per request, not per token), so ``mamba_allocator`` is separate: ``clear`` and
    ``backup_state`` here cover token slots only.
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        kvcache: KVPool,
        mamba_allocator: MambaSlotAllocator,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(size, page_size, kvcache, device)
        self.mamba_allocator = mamba_allocator


def create(config: PoolConfig) -> tuple[HybridMambaKVPool, HybridMambaAllocator]:
    """Build the hybrid pool, its shared Mamba state pool and both allocators.

    Needs ``mamba_layer_ids`` (global ids; every other layer is attention), ``mamba_size``
    (request slots) and ``temporal_state_shape``; ``conv_state_shapes`` may be empty.
    ``mamba_dtype`` defaults to float32, the precision recurrent state is usually kept in.
    ``config.options["head_major"]`` (a bool, default False) keeps the attention rows
    head-major, as the ``mha`` pool's option does.
    """
    if not config.mamba_layer_ids or config.mamba_size is None:
        raise ValueError("the mamba pool needs PoolConfig.mamba_layer_ids and mamba_size")
    if config.temporal_state_shape is None:
        raise ValueError("the mamba pool needs PoolConfig.temporal_state_shape")
    head_major = head_major_option(config)  # refused before anything is allocated
    state = MambaPool(
        size=config.mamba_size,
        mamba_layer_ids=config.mamba_layer_ids,
        conv_state_shapes=config.conv_state_shapes,
        temporal_state_shape=config.temporal_state_shape,
        dtype=config.mamba_dtype if config.mamba_dtype is not None else torch.float32,
        device=config.device,
    )
    pool = HybridMambaKVPool(
        size=config.size,
        page_size=config.page_size,
        dtype=config.dtype,
        head_num=config.head_num,
        head_dim=config.head_dim,
        layer_num=config.layer_num,
        mamba_pool=state,
        device=config.device,
        v_head_dim=config.v_head_dim,
        start_layer=config.start_layer,
        check_write_slots=config.checks_write_slots,
        head_major=head_major,
    )
    requests = MambaSlotAllocator(config.mamba_size, config.device)
    return pool, HybridMambaAllocator(config.size, config.page_size, pool, requests)


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    return [
        PoolSpec(
            name="mamba",
            pool_class=HybridMambaKVPool,
            allocator_class=HybridMambaAllocator,
            factory=create,
            capabilities=frozenset({Capability.OFFLOAD, Capability.MAMBA_STATE, Capability.PAGED}),
            description="hybrid attention + Mamba: token KV plus per-request recurrent state",
        )
    ]
