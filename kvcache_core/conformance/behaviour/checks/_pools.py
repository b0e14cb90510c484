"""Shared steps of the data checks: allocate like an engine, fill, and say where a slot lives.

Why allocate through the allocator: composite pools only work with slots their allocator
handed out (an SWA token has a window slot only once allocated; a HiSparse slot is resident
only once allocated), and an engine never writes anywhere else. Why fill every buffer with
random values first: a pool that reloads into the wrong rows, or loses a part, is only visible
when the rows it should have produced differ from what was there (zeros agree with zeros).
"""

from __future__ import annotations

from typing import Any

import torch

from ....contracts.spec import Capability
from .._check import BehaviourFailure
from .._context import CheckContext, Layer
from .._state import attention_layer_ids

__all__ = [
    "allocate",
    "allocate_source",
    "buffer_rows",
    "expected_after_write",
    "fill_everything",
    "is_window_layer",
    "index_rows",
    "kv_rows",
    "latent_width",
    "mamba_request_slots",
    "slot_orders",
    "whole_pages",
    "write_state_rows",
]


def allocate(ctx: CheckContext, allocator: Any, n: int) -> torch.Tensor:
    """``n`` token slots for one new request, as an engine gets them.

    Paged allocators (``paged`` capability) get one ``alloc_extend`` from an empty prefix, so
    ``n`` need not be a multiple of the page size and the slots start at a page boundary;
    token allocators get ``alloc`` of ``n`` rounded up to whole pages (an allocator without
    ``alloc_extend`` can only hand out whole pages when its page size is above 1), of which
    the first ``n`` are used. Running out is a failure of the check's own sizing; an allocation
    of the wrong number of slots is a finding (the checks would index past it).
    """
    if Capability.PAGED in ctx.capabilities:
        device = getattr(allocator, "device", None) or "cpu"
        asked = n
        call = f"alloc_extend(..., extend_num_tokens={n})"
        slots = allocator.alloc_extend(
            torch.tensor([0], dtype=torch.int64, device=device),
            torch.tensor([n], dtype=torch.int64, device=device),
            torch.tensor([-1], dtype=torch.int64, device=device),
            n,
        )
    else:
        asked = whole_pages(ctx, n)
        call = f"alloc({asked})"
        slots = allocator.alloc(asked)
    if slots is None:
        raise RuntimeError(f"the allocator could not provide {n} slots to the battery")
    if not isinstance(slots, torch.Tensor) or slots.numel() != asked:
        got = slots.numel() if isinstance(slots, torch.Tensor) else type(slots).__name__
        raise BehaviourFailure(
            f"allocator.{call} returned {got} slot(s), not {asked}: an allocation is never "
            "partial (None when short)",
            reproduction=ctx.reproduction(
                [
                    allocate_source(ctx, n, "out").split("[:")[0],
                    f"assert out is not None and len(out) == {asked}, "
                    f"f'asked for {asked} slots, got {{out}}'",
                ]
            ),
            hint="return exactly the slots asked for, or None when they do not fit",
        )
    result: torch.Tensor = slots.reshape(-1).to(torch.int64)[:n]
    return result


def whole_pages(ctx: CheckContext, n: int) -> int:
    """``n`` rounded up to a multiple of the config's page size."""
    page = int(ctx.config.page_size)
    return -(-n // page) * page


def slot_orders(
    slots: torch.Tensor, page: int, gen: torch.Generator
) -> list[tuple[str, torch.Tensor]]:
    """Subsets of one allocation in every order an engine may pass them, by name.

    Why the checks build these themselves: an allocator hands out slots in one order (often
    ascending pages), but an engine passes any valid slots in any order (a radix-cache hit
    followed by fresh pages, a retraction of tokens the scheduler chose, a batch of requests
    concatenated). A pool that only misbehaves for an order its own allocator never produces
    must still be caught. ``slots`` must hold at least ``2 * page`` slots starting at a page
    boundary (what `allocate` returns for that many tokens).
    """
    n = slots.numel()
    run = slots[1 : min(n, 6)]
    pages = max(1, n // page) * page
    return [
        ("an ascending run", run),
        ("a descending run", run.flip(0)),
        ("shuffled slots", slots[torch.randperm(n, generator=gen)[: max(2, n - 2)]]),
        ("a single slot", slots[n // 2 : n // 2 + 1]),
        ("whole pages", slots[: min(n, pages)]),
    ]


def allocate_source(ctx: CheckContext, n: int, name: str = "slots") -> str:
    """The source line that allocates like `allocate` (for reproductions)."""
    if Capability.PAGED in ctx.capabilities:
        return (
            f"{name} = allocator.alloc_extend(torch.tensor([0]), torch.tensor([{n}]), "
            f"torch.tensor([-1]), {n})"
        )
    asked = whole_pages(ctx, n)
    return f"{name} = allocator.alloc({asked})" + (f"[:{n}]" if asked != n else "")


def is_window_layer(ctx: CheckContext, pool: Any, layer: int) -> bool:
    return Capability.SLIDING_WINDOW in ctx.capabilities and layer in tuple(pool.swa_layer_ids)


def buffer_rows(ctx: CheckContext, pool: Any, layer: int, slots: torch.Tensor) -> torch.Tensor:
    """Rows of ``get_key_buffer(layer)`` that hold token ``slots`` (-1: held in no row).

    Window layers' buffers are indexed by window slot, HiSparse buffers by device slot; both
    go through the pool's own translation, the one its readers use.
    """
    if is_window_layer(ctx, pool, layer):
        rows = pool.translate_loc_from_full_to_swa(slots)
        return torch.where(rows > 0, rows, torch.full_like(rows, -1)).to("cpu", torch.int64)
    if Capability.HISPARSE in ctx.capabilities:
        rows = pool.translate_loc_to_device(slots).to("cpu", torch.int64)
        return torch.where(rows > 0, rows, torch.full_like(rows, -1))
    return slots.to("cpu", torch.int64)


def latent_width(pool: Any) -> int | None:
    """``kv_lora_rank`` for MLA pools (whose value buffer is the latent's first columns)."""
    rank = getattr(pool, "kv_lora_rank", None)
    return int(rank) if isinstance(rank, int) else None


def kv_rows(
    pool: Any, layer: int, n: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random K and V rows shaped like the layer's buffers, in the pool's dtype.

    Values are small integers and halves, exact in every float dtype down to fp8, so a cast
    on write never makes the read-back differ from what a check expects.
    """
    key = pool.get_key_buffer(layer)
    value = pool.get_value_buffer(layer)
    k = (torch.randint(-16, 16, (n, *key.shape[1:]), generator=gen) / 2).to(key.dtype)
    v = (torch.randint(-16, 16, (n, *value.shape[1:]), generator=gen) / 2).to(value.dtype)
    return k, v


def index_rows(pool: Any, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    dim = int(pool.index_head_dim)
    keys = (torch.randint(-8, 8, (n, dim), generator=gen) / 2).to(pool.index_dtype)
    scales = torch.randint(1, 64, (n,), generator=gen).to(torch.float32) / 8
    return keys, scales


def write_state_rows(
    ctx: CheckContext,
    pool: Any,
    slots: torch.Tensor,
    gen: torch.Generator,
    *,
    mamba_slots: torch.Tensor | None = None,
) -> None:
    """Write random content at ``slots`` in every attention layer (and the indexer), and at
    ``mamba_slots`` in every Mamba layer's state (through the ``get_mamba_state`` views, the
    way a model writes state)."""
    device = pool.device
    slots = slots.to(device)
    for layer in attention_layer_ids(ctx.config):
        k, v = kv_rows(pool, layer, slots.numel(), gen)
        pool.set_kv_buffer(Layer(layer), slots, k, v)
        if Capability.INDEXER in ctx.capabilities:
            keys, scales = index_rows(pool, slots.numel(), gen)
            pool.set_index_k_scale_buffer(layer, slots, keys, scales)
    if mamba_slots is not None and Capability.MAMBA_STATE in ctx.capabilities:
        rows = mamba_slots.reshape(-1).to(torch.int64)
        for layer in ctx.config.mamba_layer_ids:
            conv, temporal = pool.get_mamba_state(layer)
            for part in (*conv, temporal):
                values = torch.randint(-16, 16, (rows.numel(), *part.shape[1:]), generator=gen)
                part[rows.to(part.device)] = (values / 2).to(part.dtype).to(part.device)


def fill_everything(ctx: CheckContext, pool: Any, gen: torch.Generator) -> None:
    """Random content in every slot of every buffer, Mamba request slots included.

    Token writes go through ``set_kv_buffer`` with bare slots, as an engine writes; for window
    layers that reaches only tokens that already have a window slot (the others write the
    padding slot), which is all a window layer can hold.
    """
    every = torch.arange(1, int(pool.size) + int(pool.page_size), dtype=torch.int64)
    mamba: torch.Tensor | None = None
    if Capability.MAMBA_STATE in ctx.capabilities and ctx.config.mamba_layer_ids:
        _, temporal = pool.get_mamba_state(ctx.config.mamba_layer_ids[0])
        mamba = torch.arange(1, temporal.shape[0], dtype=torch.int64)
    write_state_rows(ctx, pool, every, gen, mamba_slots=mamba)


def mamba_request_slots(allocator: Any, pool: Any, n: int, taken: set[int]) -> torch.Tensor:
    """``n`` request slots: from the allocator's ``mamba_allocator`` when it has one (an
    engine's request-to-token pool does this), else the lowest slots not in ``taken``."""
    slot_allocator = getattr(allocator, "mamba_allocator", None)
    if slot_allocator is not None:
        slots = slot_allocator.alloc(n)
        if slots is None:
            raise RuntimeError(f"the Mamba slot allocator could not provide {n} request slots")
        return torch.as_tensor(slots).reshape(-1).to(torch.int64)
    _, temporal = pool.get_mamba_state(next(iter(pool.mamba_layer_ids)))
    free = [s for s in range(1, temporal.shape[0]) if s not in taken][:n]
    if len(free) < n:
        raise RuntimeError(f"the pool has fewer than {n} free request slots")
    return torch.tensor(free, dtype=torch.int64)


def expected_after_write(
    ctx: CheckContext,
    pool: Any,
    before: dict[str, torch.Tensor],
    layer: int,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    after: dict[str, torch.Tensor],
    rows: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """``before`` with the rows one ``set_kv_buffer(layer, slots, k, v)`` owns set to what it
    wrote; the padding row 0 of that layer's buffers is taken from ``after`` (tokens without
    a window or device slot are written there). ``rows`` overrides the buffer rows the write
    owns (a window layer written at an explicit ``swa_loc``; 0 or less: no row)."""
    expected = {name: t.clone() for name, t in before.items()}
    if rows is None:
        rows = buffer_rows(ctx, pool, layer, slots)
    else:
        rows = rows.to("cpu", torch.int64)
        rows = torch.where(rows > 0, rows, torch.full_like(rows, -1))
    held = rows >= 0
    rank = latent_width(pool) if Capability.MLA in ctx.capabilities else None
    key, value = expected[f"layer {layer} key"], expected[f"layer {layer} value"]
    for name in (f"layer {layer} key", f"layer {layer} value"):
        expected[name][0] = after[name][0]  # the padding row
    key[rows[held]] = k.cpu().to(key.dtype)[held]
    want_v = k[..., :rank] if rank is not None else v
    value[rows[held]] = want_v.cpu().to(value.dtype)[held]
    mla = expected.get(f"layer {layer} mla")
    if mla is not None:
        mla[slots.cpu()] = k.cpu().reshape(slots.numel(), *mla.shape[1:]).to(mla.dtype)
    return expected
