"""The whole observable state of a pool, read through the contract's getters, and where two
such states differ.

Why whole buffers: a pool that writes the right rows *and* a stray row elsewhere passes any
check that only reads back what it wrote. Every check that must "change nothing else" captures
the state before and after and compares all of it, bit for bit (NaNs included).
"""

from __future__ import annotations

from typing import Any

import torch

from ...contracts.spec import Capability, PoolConfig

__all__ = ["attention_layer_ids", "capture", "first_difference", "same_bits"]


def attention_layer_ids(config: PoolConfig) -> list[int]:
    """Global ids of the layers that hold token K/V (every layer but the Mamba ones)."""
    mamba = set(config.mamba_layer_ids)
    first = config.start_layer
    return [i for i in range(first, first + config.layer_num) if i not in mamba]


def _bits(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() and flat.dtype != torch.bool else flat


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality (two NaNs with the same payload are equal; -0.0 != 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(_bits(a.contiguous()), _bits(b.contiguous())))


def capture(
    pool: Any, config: PoolConfig, capabilities: frozenset[Capability]
) -> dict[str, torch.Tensor]:
    """A host copy of every buffer the contract lets a caller read, by a readable name.

    Per attention layer its key and value buffers; with the MLA capability the latent read
    back through ``get_mla_kv_buffer`` at every slot (for HiSparse that is the *logical*
    content, which the device buffers alone do not show); with the indexer capability the
    indexer keys and scales of every slot; with the Mamba capability every Mamba layer's
    state. Gathered reads start at slot 0, so row ``i`` of every part is slot ``i`` (request
    slot ``i`` for Mamba state). Slot counts come from the pool (HiSparse's logical ``size``
    is larger than ``config.size``). Names read like ``"layer 0 key"`` so a difference can be
    reported as it is.
    """
    state: dict[str, torch.Tensor] = {}
    layers = attention_layer_ids(config)
    for layer in layers:
        state[f"layer {layer} key"] = pool.get_key_buffer(layer).detach().to("cpu", copy=True)
        state[f"layer {layer} value"] = pool.get_value_buffer(layer).detach().to("cpu", copy=True)
    every = torch.arange(0, int(pool.size) + int(pool.page_size), dtype=torch.int64)
    every = every.to(pool.device)
    if Capability.MLA in capabilities:
        for layer in layers:
            nope, rope = pool.get_mla_kv_buffer(_Layer(layer), every)
            latent = torch.cat([nope.detach(), rope.detach()], dim=-1)
            state[f"layer {layer} mla"] = latent.to("cpu", copy=True)
    if Capability.INDEXER in capabilities:
        for layer in layers:
            keys, scales = pool.get_index_k_scale_buffer(layer, every)
            state[f"layer {layer} index_k"] = keys.detach().to("cpu", copy=True)
            state[f"layer {layer} index_k_scale"] = scales.detach().to("cpu", copy=True)
    if Capability.MAMBA_STATE in capabilities:
        for layer in config.mamba_layer_ids:
            conv, temporal = pool.get_mamba_state(layer)
            for i, c in enumerate(conv):
                state[f"mamba layer {layer} conv {i}"] = c.detach().to("cpu", copy=True)
            state[f"mamba layer {layer} temporal"] = temporal.detach().to("cpu", copy=True)
    return state


class _Layer:
    """A ``LayerLike`` (``_context.Layer`` would import this module back)."""

    __slots__ = ("layer_id",)

    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id


def first_difference(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> str | None:
    """None when both states are bit-identical; else where they first differ, in words.

    Row 0 of a buffer is its slot 0 (request slot 0 for Mamba state), so the first differing
    row is reported as a slot, with how many rows differ in all.
    """
    for name in sorted(before.keys() ^ after.keys()):
        if name not in before or name not in after:
            return f"{name!r} appeared or disappeared"
    for name, old in before.items():
        new = after[name]
        if old.shape != new.shape or old.dtype != new.dtype:
            return (
                f"{name} changed from {list(old.shape)} {old.dtype} "
                f"to {list(new.shape)} {new.dtype}"
            )
        if same_bits(old, new):
            continue
        if old.dim() == 0:
            return f"{name} differs"
        rows = old.shape[0]
        a = old.contiguous().reshape(rows, -1)
        b = new.contiguous().reshape(rows, -1)
        if a.shape[1] == 0:
            continue
        differs = ~(_bits(a).reshape(rows, -1) == _bits(b).reshape(rows, -1)).all(dim=1)
        bad = differs.nonzero().reshape(-1).tolist()
        what = "slot" if "mamba" not in name else "request slot"
        return f"{name}: {what} {bad[0]} differs ({len(bad)} row(s) differ: {bad[:8]})"
    return None
