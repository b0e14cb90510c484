"""``write-readback``: every getter returns what was written, at the slots it was written to.

Why every getter and not only the buffers: kernels read through ``get_key_buffer``, the model
through ``get_mla_kv_buffer`` and the indexer through ``get_index_k_scale_buffer``; each is a
separate code path that can gather the wrong rows. Writes go to shuffled slots (never sorted),
one layer at a time with the read right after, so a getter that sorts or dedupes its slots is
caught, and a write that leaks into another layer is left to ``write-isolation``.
"""

from __future__ import annotations

from typing import Any

import torch

from ....contracts.spec import Capability
from .._check import BehaviourFailure, behaviour_check
from .._context import CheckContext, Layer
from .._state import attention_layer_ids, same_bits
from ._pools import allocate, allocate_source, buffer_rows, is_window_layer, kv_rows, latent_width

HINT = (
    "read and write the same rows: translate slots the same way in setters and getters, "
    "gather with index_select(0, loc) in the order of `loc` (never sorted or deduplicated)"
)
_SLOTS = 6


def first_mismatch(got: torch.Tensor, want: torch.Tensor) -> int | None:
    """Index of the first row where ``got`` and ``want`` differ bit for bit, or None."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return 0
    for i in range(got.shape[0]):
        if not same_bits(got[i], want[i]):
            return i
    return None


def _fail(ctx: CheckContext, what: str, slots: torch.Tensor, row: int, steps: list[str]) -> None:
    slot = int(slots[row])
    raise BehaviourFailure(
        f"{what} does not read back what was written: first wrong slot {slot} "
        f"(position {row} of slots {slots.tolist()})",
        reproduction=ctx.reproduction(
            [
                allocate_source(ctx, 2 * int(ctx.config.page_size) + _SLOTS, "allocated"),
                f"slots = torch.tensor({slots.tolist()})  # of those, shuffled",
                *steps,
            ]
        ),
        hint=HINT,
    )


def _kv(ctx: CheckContext, pool: Any, slots: torch.Tensor, gen: torch.Generator) -> None:
    rank = latent_width(pool) if Capability.MLA in ctx.capabilities else None
    for layer in attention_layer_ids(ctx.config):
        k, v = kv_rows(pool, layer, slots.numel(), gen)
        pool.set_kv_buffer(Layer(layer), slots.to(pool.device), k, v)
        rows = buffer_rows(ctx, pool, layer, slots)
        key = pool.get_key_buffer(layer).detach().cpu()
        value = pool.get_value_buffer(layer).detach().cpu()
        want_v = k[..., :rank] if rank is not None else v
        steps = [
            f"layer = {layer}",
            "k = torch.randint(-16, 16, (len(slots), *pool.get_key_buffer(layer).shape[1:])) / 2",
            "v = torch.randint(-16, 16, (len(slots), *pool.get_value_buffer(layer).shape[1:])) / 2",
            "pool.set_kv_buffer(Layer(layer), slots, k, v)",
        ]
        if is_window_layer(ctx, pool, layer):
            steps.append("rows = pool.translate_loc_from_full_to_swa(slots)")
        elif Capability.HISPARSE in ctx.capabilities:
            steps.append("rows = pool.translate_loc_to_device(slots)")
        else:
            steps.append("rows = slots")
        for what, buffer, want in (("key", key, k), ("value", value, want_v)):
            row = first_mismatch(buffer[rows], want.cpu().to(buffer.dtype))
            if row is not None:
                value_expr = "k[..., :pool.kv_lora_rank]" if rank is not None else "v"
                expected = "k" if what == "key" else value_expr
                getter = f"get_{what}_buffer"
                _fail(
                    ctx,
                    f"layer {layer} {getter}",
                    slots,
                    row,
                    [
                        *steps,
                        f"assert torch.equal(pool.{getter}(layer)[rows], "
                        f"{expected}.to(pool.{getter}(layer).dtype))",
                    ],
                )


def _special(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Rows whose values are ``-0.0`` and NaN (alternating), in ``dtype``.

    Why: a cache stores bits, not numbers. A pool that "normalises" what it stores (``x + 0``
    turns ``-0.0`` into ``+0.0``; a sanitising ``nan_to_num``) changes a model's output
    where a softmax meets a masked ``-0.0`` or a NaN that should have propagated, and every
    comparison by value (``==``, ``torch.equal``) calls the two equal or never equal.
    """
    values = torch.tensor([-0.0, float("nan")], dtype=torch.float32)
    count = 1
    for d in shape:
        count *= d
    return values.repeat(count // 2 + 1)[:count].reshape(shape).to(dtype)


def _held(first: torch.Tensor, again: torch.Tensor) -> bool:
    """Whether two calls of one getter returned the same storage (the pool's own buffer), not
    a fresh copy each time (the dequantised view of a quantised store)."""
    return bool(first.untyped_storage().data_ptr() == again.untyped_storage().data_ptr())


def _special_values(ctx: CheckContext, pool: Any, slots: torch.Tensor) -> None:
    """``-0.0`` and NaN written through ``set_kv_buffer`` read back bit for bit, wherever the
    getters return the pool's own buffers (a quantised pool's dequantised copies are exempt)."""
    rank = latent_width(pool) if Capability.MLA in ctx.capabilities else None
    for layer in attention_layer_ids(ctx.config):
        key = pool.get_key_buffer(layer)
        value = pool.get_value_buffer(layer)
        if not (key.dtype.is_floating_point and value.dtype.is_floating_point):
            continue
        if not (
            _held(key, pool.get_key_buffer(layer)) and _held(value, pool.get_value_buffer(layer))
        ):
            continue  # a dequantised copy: a quantised store keeps values, not these bits
        k = _special(key.dtype, (slots.numel(), *key.shape[1:]))
        v = _special(value.dtype, (slots.numel(), *value.shape[1:]))
        pool.set_kv_buffer(Layer(layer), slots.to(pool.device), k, v)
        rows = buffer_rows(ctx, pool, layer, slots)
        want_v = k[..., :rank] if rank is not None else v
        for what, buffer, want in (
            ("key", pool.get_key_buffer(layer), k),
            ("value", pool.get_value_buffer(layer), want_v),
        ):
            got = buffer.detach().cpu()[rows]
            row = first_mismatch(got, want.to(got.dtype))
            if row is None:
                continue
            raise BehaviourFailure(
                f"layer {layer} get_{what}_buffer does not hold the bits written: slot "
                f"{int(slots[row])} was written -0.0 and NaN and reads "
                f"{got[row].reshape(-1)[:2].tolist()} (a pool stores bits, it must not "
                "normalise -0.0 or NaN)",
                reproduction=ctx.reproduction(
                    [
                        allocate_source(ctx, 2 * int(ctx.config.page_size) + _SLOTS, "allocated"),
                        f"slots = torch.tensor({slots.tolist()})",
                        f"layer = {layer}",
                        "def special(shape, dtype):",
                        "    n = torch.zeros(shape).numel()",
                        "    t = torch.tensor([-0.0, float('nan')]).repeat(n // 2 + 1)[:n]",
                        "    return t.reshape(shape).to(dtype)",
                        "key, value = pool.get_key_buffer(layer), pool.get_value_buffer(layer)",
                        "k = special((len(slots), *key.shape[1:]), key.dtype)",
                        "v = special((len(slots), *value.shape[1:]), value.dtype)",
                        "pool.set_kv_buffer(Layer(layer), slots, k, v)",
                        "rows = pool.translate_loc_from_full_to_swa(slots)"
                        if is_window_layer(ctx, pool, layer)
                        else "rows = slots",
                        "got = pool.get_key_buffer(layer)[rows]",
                        "assert torch.equal(got.view(torch.uint8), k.view(torch.uint8)), "
                        "'the stored bits differ from the written ones (-0.0 or NaN changed)'",
                    ]
                ),
                hint="store exactly the bits given: no arithmetic on the way in (no `+ 0`, "
                "no nan_to_num); a cast to the pool's dtype is all",
            )


def _mla(ctx: CheckContext, pool: Any, slots: torch.Tensor, gen: torch.Generator) -> None:
    rank, rope = int(pool.kv_lora_rank), int(pool.qk_rope_head_dim)
    for layer in attention_layer_ids(ctx.config):
        nope = (torch.randint(-16, 16, (slots.numel(), 1, rank), generator=gen) / 2).to(pool.dtype)
        pe = (torch.randint(-16, 16, (slots.numel(), 1, rope), generator=gen) / 2).to(pool.dtype)
        pool.set_mla_kv_buffer(Layer(layer), slots.to(pool.device), nope, pe)
        got_nope, got_rope = pool.get_mla_kv_buffer(Layer(layer), slots.to(pool.device))
        steps = [
            f"layer = {layer}",
            f"nope = torch.randint(-16, 16, (len(slots), 1, {rank})) / 2",
            f"rope = torch.randint(-16, 16, (len(slots), 1, {rope})) / 2",
            "pool.set_mla_kv_buffer(Layer(layer), slots, nope, rope)",
            "got_nope, got_rope = pool.get_mla_kv_buffer(Layer(layer), slots)",
        ]
        for what, got, want, name in (
            ("nope", got_nope, nope, "got_nope, nope"),
            ("rope", got_rope, pe, "got_rope, rope"),
        ):
            row = first_mismatch(got.detach().cpu(), want.to(got.dtype))
            if row is not None:
                _fail(
                    ctx,
                    f"layer {layer} get_mla_kv_buffer ({what}) after set_mla_kv_buffer",
                    slots,
                    row,
                    [*steps, f"assert torch.equal({name}.to(got_{what}.dtype))"],
                )
        rows = buffer_rows(ctx, pool, layer, slots)
        key = pool.get_key_buffer(layer).detach().cpu()
        want_key = torch.cat([nope, pe], dim=-1).to(key.dtype)
        row = first_mismatch(key[rows].reshape(want_key.shape), want_key)
        if row is not None:
            device = Capability.HISPARSE in ctx.capabilities
            _fail(
                ctx,
                f"layer {layer} get_key_buffer after set_mla_kv_buffer",
                slots,
                row,
                [
                    *steps,
                    "rows = pool.translate_loc_to_device(slots)" if device else "rows = slots",
                    "key = pool.get_key_buffer(layer)[rows]",
                    "assert torch.equal(key, torch.cat([nope, rope], -1).to(key.dtype))",
                ],
            )


def _indexer(ctx: CheckContext, pool: Any, slots: torch.Tensor, gen: torch.Generator) -> None:
    dim = int(pool.index_head_dim)
    for layer in attention_layer_ids(ctx.config):
        keys = (torch.randint(-8, 8, (slots.numel(), dim), generator=gen) / 2).to(pool.index_dtype)
        scales = torch.randint(1, 64, (slots.numel(),), generator=gen).to(torch.float32) / 8
        pool.set_index_k_scale_buffer(layer, slots.to(pool.device), keys, scales)
        got_k, got_s = pool.get_index_k_scale_buffer(layer, slots.to(pool.device))
        steps = [
            f"layer = {layer}",
            f"keys = (torch.randint(-8, 8, (len(slots), {dim})) / 2).to(pool.index_dtype)",
            "scales = torch.randint(1, 64, (len(slots),)).float() / 8",
            "pool.set_index_k_scale_buffer(layer, slots, keys, scales)",
            "got_keys, got_scales = pool.get_index_k_scale_buffer(layer, slots)",
        ]
        for what, got, want, check in (
            ("keys", got_k, keys, "got_keys.view(torch.uint8), keys.view(torch.uint8)"),
            ("scales", got_s, scales, "got_scales.reshape(-1), scales"),
        ):
            row = first_mismatch(got.detach().cpu().reshape(want.shape), want.to(got.dtype))
            if row is not None:
                _fail(
                    ctx,
                    f"layer {layer} get_index_k_scale_buffer ({what})",
                    slots,
                    row,
                    [*steps, f"assert torch.equal({check})"],
                )


def _can_evict(allocator: Any) -> bool:
    """Residency changes need the allocator's ``free_device``/``alloc_device`` (the built-in
    HiSparse allocator's API, see docs/pools/hisparse.md); the contract does not require them,
    so an allocator without them skips these scenarios rather than failing them."""
    return callable(getattr(allocator, "free_device", None)) and callable(
        getattr(allocator, "alloc_device", None)
    )


def _hisparse(ctx: CheckContext, pool: Any, allocator: Any, gen: torch.Generator) -> None:
    """A page leaves the device, is written while not resident, and comes back: logical reads
    and the device rows must show the latest write (not the row the device held before)."""
    page = int(pool.page_size)
    slots = allocate(ctx, allocator, 2 * page)
    layer = attention_layer_ids(ctx.config)[0]
    k, v = kv_rows(pool, layer, slots.numel(), gen)
    pool.set_kv_buffer(Layer(layer), slots.to(pool.device), k, v)
    allocator.free_device(slots)
    k2, v2 = kv_rows(pool, layer, slots.numel(), gen)
    pool.set_kv_buffer(Layer(layer), slots.to(pool.device), k2, v2)
    device_slots = allocator.alloc_device(slots)
    if device_slots is None:
        raise RuntimeError("the HiSparse allocator could not make 2 pages resident again")
    pool.load_to_device(slots, device_slots)
    steps = [
        f"slots = allocator.alloc({2 * page})",
        f"layer = {layer}",
        "shape = (len(slots), *pool.get_key_buffer(layer).shape[1:])",
        "old, new = torch.randint(-16, 16, shape) / 2, torch.randint(-16, 16, shape) / 2",
        "pool.set_kv_buffer(Layer(layer), slots, old, old)",
        "allocator.free_device(slots)",
        "pool.set_kv_buffer(Layer(layer), slots, new, new)",
        "pool.load_to_device(slots, allocator.alloc_device(slots))",
    ]
    nope, rope = pool.get_mla_kv_buffer(Layer(layer), slots.to(pool.device))
    got = torch.cat([nope, rope], dim=-1).detach().cpu()
    row = first_mismatch(got.reshape(k2.shape), k2.to(got.dtype))
    if row is not None:
        raise BehaviourFailure(
            f"layer {layer} get_mla_kv_buffer after a page became resident again: slot "
            f"{int(slots[row])} reads a stale row, not the write made while it was not resident",
            reproduction=ctx.reproduction(
                [
                    *steps,
                    "nope, rope = pool.get_mla_kv_buffer(Layer(layer), slots)",
                    "assert torch.equal(torch.cat([nope, rope], -1), new)",
                ]
            ),
            hint="load_to_device must copy the logical store's current rows",
        )
    rows = buffer_rows(ctx, pool, layer, slots)
    key = pool.get_key_buffer(layer).detach().cpu()
    row = first_mismatch(key[rows], k2.to(key.dtype))
    if row is not None:
        raise BehaviourFailure(
            f"layer {layer} get_key_buffer (device rows) after a page became resident again: "
            f"slot {int(slots[row])} (device row {int(rows[row])}) holds a stale row",
            reproduction=ctx.reproduction(
                [
                    *steps,
                    "rows = pool.translate_loc_to_device(slots)",
                    "assert torch.equal(pool.get_key_buffer(layer)[rows], new)",
                ]
            ),
            hint="load_to_device must copy the logical store's current rows",
        )


def _hisparse_extend(ctx: CheckContext, pool: Any, allocator: Any, gen: torch.Generator) -> None:
    """A request's partial last page is evicted, written while not resident, and the request
    then extends by one token (``alloc_extend``), which makes that page resident again: the
    page's earlier tokens must read back as last written, through the device too."""
    page = int(pool.page_size)
    n = page + max(1, page // 2)
    slots = allocate(ctx, allocator, n)
    layer = attention_layer_ids(ctx.config)[0]
    k, v = kv_rows(pool, layer, n, gen)
    pool.set_kv_buffer(Layer(layer), slots.to(pool.device), k, v)
    allocator.free_device(slots)
    k2, v2 = kv_rows(pool, layer, n, gen)
    pool.set_kv_buffer(Layer(layer), slots.to(pool.device), k2, v2)
    device = getattr(allocator, "device", None) or "cpu"
    grown = allocator.alloc_extend(
        torch.tensor([n], device=device),
        torch.tensor([n + 1], device=device),
        slots[-1:].to(device),
        1,
    )
    if grown is None:
        raise RuntimeError("the HiSparse allocator could not extend the request by one token")
    partial = slots[(n // page) * page :]
    nope, rope = pool.get_mla_kv_buffer(Layer(layer), partial.to(pool.device))
    got = torch.cat([nope, rope], dim=-1).detach().cpu()
    want = k2[(n // page) * page :]
    row = first_mismatch(got.reshape(want.shape), want.to(got.dtype))
    if row is not None:
        raise BehaviourFailure(
            f"layer {layer} get_mla_kv_buffer: after alloc_extend made an evicted partial page "
            f"resident again, slot {int(partial[row])} reads a stale device row, not the write "
            "made while it was not resident",
            reproduction=ctx.reproduction(
                [
                    allocate_source(ctx, n),
                    f"layer = {layer}",
                    "shape = (len(slots), *pool.get_key_buffer(layer).shape[1:])",
                    "old = torch.randint(-16, 16, shape) / 2",
                    "new = torch.randint(-16, 16, shape) / 2",
                    "pool.set_kv_buffer(Layer(layer), slots, old, old)",
                    "allocator.free_device(slots)",
                    "pool.set_kv_buffer(Layer(layer), slots, new, new)",
                    f"allocator.alloc_extend(torch.tensor([{n}]), torch.tensor([{n + 1}]), "
                    "slots[-1:], 1)",
                    f"tail = slots[{(n // page) * page}:]",
                    "nope, rope = pool.get_mla_kv_buffer(Layer(layer), tail)",
                    f"assert torch.equal(torch.cat([nope, rope], -1), new[{(n // page) * page}:])",
                ]
            ),
            hint="when a page becomes resident again, copy its logical rows to the device page",
        )


def _mamba(ctx: CheckContext, pool: Any, gen: torch.Generator) -> None:
    """State written through the ``get_mamba_state`` views reads back through a new call;
    ``copy_slots`` forks it and ``clear_slots`` zeroes it."""
    for layer in ctx.config.mamba_layer_ids:
        conv, temporal = pool.get_mamba_state(layer)
        parts = (*conv, temporal)
        src = torch.tensor([2, 1], dtype=torch.int64)
        for part in parts:
            shape = (src.numel(), *part.shape[1:])
            part[src.to(part.device)] = (torch.randint(1, 16, shape, generator=gen) / 2).to(
                part.dtype
            )
        wrote = [part[src.to(part.device)].detach().cpu().clone() for part in parts]
        steps = [
            f"layer = {layer}",
            "src = torch.tensor([2, 1])",
            "conv, temporal = pool.get_mamba_state(layer)",
            "temporal[src] = 1.5",
        ]
        again = pool.get_mamba_state(layer)
        for i, part in enumerate((*again[0], again[1])):
            if first_mismatch(part[src.to(part.device)].detach().cpu(), wrote[i]) is not None:
                raise BehaviourFailure(
                    f"mamba layer {layer} get_mamba_state part {i}: state written through the "
                    "returned tensors does not read back through a new call (not views?)",
                    reproduction=ctx.reproduction(
                        [*steps, "assert (pool.get_mamba_state(layer)[1][src] == 1.5).all()"]
                    ),
                    hint="get_mamba_state must return views of the stored state",
                )
        dst = torch.tensor([3], dtype=torch.int64)
        pool.copy_slots(src[:1].to(pool.device), dst.to(pool.device))
        again = pool.get_mamba_state(layer)
        for i, part in enumerate((*again[0], again[1])):
            if first_mismatch(part[dst.to(part.device)].detach().cpu(), wrote[i][:1]) is not None:
                raise BehaviourFailure(
                    f"mamba layer {layer} part {i}: after copy_slots(src=[2], dst=[3]) request "
                    "slot 3 does not hold slot 2's state",
                    reproduction=ctx.reproduction(
                        [
                            *steps,
                            "pool.copy_slots(torch.tensor([2]), torch.tensor([3]))",
                            "conv, temporal = pool.get_mamba_state(layer)",
                            "assert torch.equal(temporal[3], temporal[2])",
                        ]
                    ),
                    hint="copy_slots(src, dst) copies every state part of src to dst",
                )
        pool.clear_slots(src.to(pool.device))
        again = pool.get_mamba_state(layer)
        for i, part in enumerate((*again[0], again[1])):
            if bool(part[src.to(part.device)].ne(0).any()):
                raise BehaviourFailure(
                    f"mamba layer {layer} part {i}: clear_slots([2, 1]) left nonzero state",
                    reproduction=ctx.reproduction(
                        [
                            *steps,
                            "pool.clear_slots(src)",
                            "assert (pool.get_mamba_state(layer)[1][src] == 0).all()",
                        ]
                    ),
                    hint="clear_slots zeroes every state part of the given request slots",
                )


@behaviour_check("write-readback", hint=HINT)
def write_readback(ctx: CheckContext) -> None:
    """Every getter reads back what was written, at the written slots (shuffled order)."""
    pool, allocator = ctx.build()
    gen = ctx.generator(11)
    slots = allocate(ctx, allocator, 2 * int(pool.page_size) + _SLOTS)
    order = torch.randperm(slots.numel(), generator=gen)[:_SLOTS]
    chosen = slots[order]
    _kv(ctx, pool, chosen, gen)
    _special_values(ctx, pool, chosen[:2])
    if Capability.MLA in ctx.capabilities:
        _mla(ctx, pool, chosen, gen)
    if Capability.INDEXER in ctx.capabilities:
        _indexer(ctx, pool, chosen, gen)
    if Capability.HISPARSE in ctx.capabilities and _can_evict(allocator):
        _hisparse(ctx, pool, allocator, gen)
        _hisparse_extend(ctx, pool, allocator, gen)
    if Capability.MAMBA_STATE in ctx.capabilities:
        _mamba(ctx, pool, gen)
