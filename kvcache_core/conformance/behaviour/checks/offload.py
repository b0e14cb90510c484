"""Offload: ``offload-roundtrip`` (a reload puts the old content at the new slots and changes
nothing else) and ``snapshot-is-copy`` (a snapshot shares no memory with the pool).

Why the whole state, and new slots: retraction copies a request out, frees its slots, and
later reloads into whatever the allocator hands out next. A pool that reloads at the old
slots, in the wrong order, or leaves a part out (the indexer keys, the Mamba state) resumes
the request on foreign data; a pool whose snapshot is a view loses it as soon as the freed
slots are reused. Slots come from the allocator, so composite pools are exercised the way an
engine drives them (window slots re-created on reload, HiSparse residency).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ....contracts.snapshot import KVSnapshot
from ....contracts.spec import Capability
from .._check import BehaviourFailure, behaviour_check
from .._context import CheckContext, Layer
from .._state import attention_layer_ids, capture, first_difference, same_bits
from ._pools import (
    allocate,
    allocate_source,
    buffer_rows,
    expected_after_write,
    fill_everything,
    kv_rows,
    latent_width,
    mamba_request_slots,
    slot_orders,
    write_state_rows,
)

ROUNDTRIP_HINT = (
    "get_cpu_copy must copy the rows of every per-slot buffer (indexer and state included) "
    "and load_cpu_copy must write them at the NEW `indices` in their order (and the state at "
    "the new `mamba_indices`), touching nothing else"
)
COPY_HINT = (
    "gather into freshly allocated host tensors (index_select(..., out=...)), never return "
    "views or slices of the pool's buffers, and copy out of the snapshot on reload"
)


@dataclass(frozen=True)
class _Pattern:
    """Which of a request's ``n`` slots are offloaded: positions into the allocation.

    ``resumable`` patterns are a request's tokens in order, so the reloaded slots form a
    request that can decode on (a shuffled or single-slot set exercises the copy only: an
    engine never resumes a request whose last token slid out of the window).
    """

    name: str
    tokens: int
    pick: Callable[[int, int, torch.Generator], list[int]]
    resumable: bool = False
    #: The order of the new slots the snapshot is reloaded at: as the allocator handed them
    #: out, reversed, or shuffled (engines reload at any valid slots, in any order).
    targets: str = "as allocated"


def _run(n: int, page: int, gen: torch.Generator) -> list[int]:
    return list(range(1, min(n, 1 + 5)))


def _descending(n: int, page: int, gen: torch.Generator) -> list[int]:
    return _run(n, page, gen)[::-1]


def _shuffled(n: int, page: int, gen: torch.Generator) -> list[int]:
    return [int(i) for i in torch.randperm(n, generator=gen)[: max(2, n - 2)]]


def _single(n: int, page: int, gen: torch.Generator) -> list[int]:
    return [n // 2]


def _pages(n: int, page: int, gen: torch.Generator) -> list[int]:
    return list(range(0, (n // page) * page))


def _patterns(page: int) -> list[_Pattern]:
    return [
        _Pattern("a run", page + 3, _run, resumable=True),
        _Pattern("a descending run", page + 3, _descending, targets="reversed"),
        _Pattern("shuffled slots", page + 3, _shuffled, targets="shuffled"),
        _Pattern("a single slot", 3, _single),
        _Pattern("whole pages", 2 * page, _pages, resumable=True),
    ]


def _ordered(new: torch.Tensor, targets: str, gen: torch.Generator) -> list[int]:
    """Positions into the freshly allocated slots, in the order the reload passes them."""
    m = new.numel()
    if targets == "reversed":
        return list(range(m - 1, -1, -1))
    if targets == "shuffled":
        order = [int(i) for i in torch.randperm(m, generator=gen)]
        # Never ascending by chance: the point is an order the allocator did not hand out.
        return order if order != sorted(order) or m < 2 else order[::-1]
    return list(range(m))


def _rows_for(
    ctx: CheckContext,
    pool: Any,
    state: dict[str, torch.Tensor],
    slots: torch.Tensor,
    mamba: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """For each part of a captured state, the rows that hold ``slots`` (or ``mamba``)."""
    rows: dict[str, torch.Tensor] = {}
    for layer in attention_layer_ids(ctx.config):
        held = buffer_rows(ctx, pool, layer, slots)
        rows[f"layer {layer} key"] = held
        rows[f"layer {layer} value"] = held
    for name in state:
        if name.startswith("mamba "):
            if mamba is not None:
                rows[name] = mamba.cpu()
        elif name not in rows:
            rows[name] = slots.cpu()
    return rows


def _expected_after_reload(
    before: dict[str, torch.Tensor],
    old_state: dict[str, torch.Tensor],
    old_rows: dict[str, torch.Tensor],
    new_rows: dict[str, torch.Tensor],
    rank: int | None = None,
) -> dict[str, torch.Tensor]:
    """``before`` with the new slots' rows holding the old slots' content.

    A token that held no row of a buffer before (a window slot it had lost, a page not on the
    device) gives that buffer nothing to expect, except on a HiSparse device buffer: there the
    new resident row must hold the token's logical latent (``layer L mla``; values are its
    first ``rank`` columns).
    """
    expected = {name: t.clone() for name, t in before.items()}
    for name, new in new_rows.items():
        old = old_rows.get(name)
        if old is None:
            continue
        keep = (new >= 0) & (old >= 0)
        expected[name][new[keep]] = old_state[name][old[keep]]
        words = name.split()
        latent = f"layer {words[1]} mla" if words[0] == "layer" else ""
        if rank is None or words[-1] not in ("key", "value") or latent not in old_rows:
            continue
        lost = (new >= 0) & (old < 0)
        source = old_state[latent][old_rows[latent][lost]]
        if words[-1] == "value":
            source = source[..., :rank]
        expected[name][new[lost]] = source.to(expected[name].dtype)
    return expected


def _roundtrip(
    ctx: CheckContext,
    pattern: _Pattern,
    through: str,
    with_state: bool,
    salt: int,
    evict: bool = False,
) -> None:
    pool, allocator = ctx.build()
    target = pool if through == "pool" else allocator
    gen = ctx.generator(salt)
    fill_everything(ctx, pool, gen)
    page = int(pool.page_size)
    n = pattern.tokens
    old_all = allocate(ctx, allocator, n)
    picks = pattern.pick(n, page, gen)
    old = old_all[torch.tensor(picks, dtype=torch.int64)]
    old_m: torch.Tensor | None = None
    new_m: torch.Tensor | None = None
    if with_state:
        old_m = mamba_request_slots(allocator, pool, 2, set())
        write_state_rows(ctx, pool, old_all, gen, mamba_slots=old_m)
    else:
        write_state_rows(ctx, pool, old_all, gen)
    if evict:
        _evict_first_page(ctx, allocator, old_all)
    old_state = capture(pool, ctx.config, ctx.capabilities)
    old_rows = _rows_for(ctx, pool, old_state, old, old_m)
    dev = pool.device
    snapshot = target.get_cpu_copy(
        old.to(dev), mamba_indices=None if old_m is None else old_m.to(dev)
    )
    new_all = allocate(ctx, allocator, len(picks))
    order = _ordered(new_all, pattern.targets, gen)
    new = new_all[torch.tensor(order, dtype=torch.int64)]
    if old_m is not None:
        new_m = mamba_request_slots(allocator, pool, 2, {int(s) for s in old_m.tolist()})
    allocator.free(old_all.to(dev))
    before = capture(pool, ctx.config, ctx.capabilities)
    target.load_cpu_copy(
        snapshot, new.to(dev), mamba_indices=None if new_m is None else new_m.to(dev)
    )
    after = capture(pool, ctx.config, ctx.capabilities)
    new_rows = _rows_for(ctx, pool, after, new, new_m)
    hisparse_rank = latent_width(pool) if Capability.HISPARSE in ctx.capabilities else None
    expected = _expected_after_reload(before, old_state, old_rows, new_rows, hisparse_rank)
    where = first_difference(expected, after)
    if where is None and pattern.resumable:
        _decode_after_reload(
            ctx, pool, allocator, new_all, after, gen, pattern, call_name(through), evict
        )
    if where is None:
        return
    state = " with mamba_indices" if with_state else ""
    state += f" ({_EVICTED[Capability.SLIDING_WINDOW in ctx.capabilities]})" if evict else ""
    call = "pool" if through == "pool" else "allocator"
    differing = next(name for name in after if not same_bits(expected[name], after[name]))
    steps = roundtrip_steps(ctx, pool, differing, call, n, picks, old_m, new_m, evict, order)
    raise BehaviourFailure(
        f"offload of {pattern.name} (slots {old.tolist()}) through the {call}{state}, reloaded "
        f"at new slots {new.tolist()}"
        + (f" and request slots {new_m.tolist()}" if new_m is not None else "")
        + f": the state after reload is not the old content at the new slots with everything "
        f"else unchanged: {where}",
        reproduction=ctx.reproduction(steps),
        hint=ROUNDTRIP_HINT,
    )


_EVICTABLE = frozenset({Capability.SLIDING_WINDOW, Capability.HISPARSE})
_EVICTED = {True: "first page out of the window", False: "first page not resident"}


def _evict_call(ctx: CheckContext) -> str:
    return "free_swa" if Capability.SLIDING_WINDOW in ctx.capabilities else "free_device"


def _evict_first_page(ctx: CheckContext, allocator: Any, slots: torch.Tensor) -> None:
    """The request's first page slid out of the window (SWA: ``free_swa``) or was evicted
    from the device (HiSparse: ``free_device``) before it was offloaded, as happens to old
    tokens of a long request; the snapshot must still carry what the pool holds for them."""
    first_page = slots[: int(ctx.config.page_size)]
    getattr(allocator, _evict_call(ctx))(first_page)


def call_name(through: str) -> str:
    return "pool" if through == "pool" else "allocator"


def _decode_after_reload(
    ctx: CheckContext,
    pool: Any,
    allocator: Any,
    new_all: torch.Tensor,
    state: dict[str, torch.Tensor],
    gen: torch.Generator,
    pattern: _Pattern,
    call: str,
    evict: bool,
) -> None:
    """The resumed request decodes its next token (``alloc_decode``, then a write to every
    layer): that token must land in its own rows and the reloaded tokens must stay intact.
    A reload that left the allocator's bookkeeping (window slots, residency) inconsistent
    with the pool shows here, where an engine would meet it."""
    if Capability.PAGED not in ctx.capabilities:
        return
    m = new_all.numel()
    device = getattr(allocator, "device", None) or "cpu"
    token = allocator.alloc_decode(torch.tensor([m + 1], device=device), new_all[-1:].to(device))
    if token is None:
        raise RuntimeError("the allocator could not give the resumed request its next token")
    token = token.reshape(-1).to(torch.int64)
    # Allocation may change what unwritten slots read (a new HiSparse page brings whatever its
    # device page held): only the reloaded tokens must read as before.
    allocated = capture(pool, ctx.config, ctx.capabilities)
    rows = _rows_for(ctx, pool, allocated, new_all, None)
    unchanged = {name: t.clone() for name, t in allocated.items()}
    for name, held in rows.items():
        held = held[held >= 0]
        unchanged[name][held] = state[name][held]
    where = first_difference(unchanged, allocated)
    if where is not None:
        raise BehaviourFailure(
            f"after {pattern.name} was offloaded and reloaded through the {call} at new slots "
            f"{new_all.tolist()}, allocating the request's next token (alloc_decode gave slot "
            f"{int(token[0])}) changed what the reloaded tokens read: {where}",
            reproduction=ctx.reproduction(
                decode_steps(ctx, pool, call, m, evict, attention_layer_ids(ctx.config)[0], False)
            ),
            hint="load_cpu_copy (with its allocator) must leave slot bookkeeping as a fresh "
            "allocation would: the next alloc_decode extends the reloaded request",
        )
    state = allocated
    for layer in attention_layer_ids(ctx.config):
        k, v = kv_rows(pool, layer, 1, gen)
        pool.set_kv_buffer(Layer(layer), token.to(pool.device), k, v)
        after = capture(pool, ctx.config, ctx.capabilities)
        expected = expected_after_write(ctx, pool, state, layer, token, k, v, after)
        where = first_difference(expected, after)
        if where is not None:
            raise BehaviourFailure(
                f"after {pattern.name} was offloaded and reloaded through the {call} at new "
                f"slots {new_all.tolist()}, the request's next token (alloc_decode gave slot "
                f"{int(token[0])}) written to layer {layer} did not land only in its own rows: "
                f"{where}",
                reproduction=ctx.reproduction(decode_steps(ctx, pool, call, m, evict, layer, True)),
                hint="load_cpu_copy (with its allocator) must leave slot bookkeeping as a fresh "
                "allocation would: the next alloc_decode extends the reloaded request",
            )
        state = after


def decode_steps(
    ctx: CheckContext, pool: Any, call: str, m: int, evict: bool, layer: int, write: bool
) -> list[str]:
    """Reproduction of the decode after a reload: allocating the next token must leave every
    reloaded token as it was (``write=False``); writing it must land in its own row only."""
    layers = attention_layer_ids(ctx.config)
    if Capability.SLIDING_WINDOW in ctx.capabilities and layer in tuple(pool.swa_layer_ids):
        translate = "pool.translate_loc_from_full_to_swa"
    elif Capability.HISPARSE in ctx.capabilities:
        translate = "pool.translate_loc_to_device"
    else:
        translate = ""
    steps = [
        allocate_source(ctx, m, "old"),
        f"layer, layers = {layer}, {layers}",
        "for i in layers:",
        "    shape = (len(old), *pool.get_key_buffer(i).shape[1:])",
        "    vshape = (len(old), *pool.get_value_buffer(i).shape[1:])",
        "    pool.set_kv_buffer(Layer(i), old, torch.randint(1, 16, shape) / 2, "
        "torch.randint(1, 16, vshape) / 2)",
    ]
    if evict:
        steps.append(f"allocator.{_evict_call(ctx)}(old[:{int(pool.page_size)}])")
    steps += [
        f"snapshot = {call}.get_cpu_copy(old)",
        allocate_source(ctx, m, "new"),
        "allocator.free(old)",
        f"{call}.load_cpu_copy(snapshot, new)",
        f"rows = {translate}(new)" if translate else "rows = new",
        "rows = rows[rows > 0]",
        "kept = pool.get_key_buffer(layer)[rows].clone()",
        f"token = allocator.alloc_decode(torch.tensor([{m + 1}]), new[-1:])",
    ]
    if write:
        steps += [
            "shape = (1, *pool.get_key_buffer(layer).shape[1:])",
            "vshape = (1, *pool.get_value_buffer(layer).shape[1:])",
            "pool.set_kv_buffer(Layer(layer), token, torch.full(shape, -3.0), "
            "torch.full(vshape, -3.0))",
            f"token_rows = {translate}(token)" if translate else "token_rows = token",
            "assert (pool.get_key_buffer(layer)[token_rows] == -3.0).all()",
        ]
    steps.append("assert torch.equal(pool.get_key_buffer(layer)[rows], kept)")
    return steps


def roundtrip_steps(
    ctx: CheckContext,
    pool: Any,
    differing: str,
    call: str,
    n: int,
    picks: list[int],
    old_m: torch.Tensor | None,
    new_m: torch.Tensor | None,
    evict: bool,
    order: list[int] | None = None,
) -> list[str]:
    """Reproduction steps for the part that differed: write it, offload, reload, compare
    (``order``: positions into the new allocation, in the order the reload passed them)."""
    words = differing.split()
    layer = int(words[2] if words[0] == "mamba" else words[1])
    steps = [allocate_source(ctx, n, "old_all"), f"old = old_all[{picks}]"]
    mamba_old = mamba_new = ""
    if old_m is not None and new_m is not None:
        steps.append(
            f"old_m, new_m = torch.tensor({old_m.tolist()}), torch.tensor({new_m.tolist()})"
        )
        mamba_old, mamba_new = ", mamba_indices=old_m", ", mamba_indices=new_m"
    steps.append(f"layer = {layer}")
    if words[0] == "mamba":
        steps += [
            "conv, temporal = pool.get_mamba_state(layer)",
            "temporal[old_m] = torch.randint(1, 16, temporal[old_m].shape).to(temporal.dtype)",
            "want = temporal[old_m].clone()",
        ]
    elif words[-1] in ("index_k", "index_k_scale"):
        steps += [
            "keys = (torch.randint(-8, 8, (len(old_all), pool.index_head_dim)) / 2)"
            ".to(pool.index_dtype)",
            "scales = torch.randint(1, 64, (len(old_all),)).float() / 8",
            "pool.set_index_k_scale_buffer(layer, old_all, keys, scales)",
        ]
    else:
        steps += [
            "k = torch.randint(-16, 16, (len(old_all), *pool.get_key_buffer(layer).shape[1:])) / 2",
            "v = torch.randint(-16, 16, (len(old_all), *pool.get_value_buffer(layer).shape[1:]))"
            " / 2",
            "pool.set_kv_buffer(Layer(layer), old_all, k, v)",
        ]
    if evict:
        steps.append(f"allocator.{_evict_call(ctx)}(old_all[:{int(pool.page_size)}])")
    steps += [
        f"snapshot = {call}.get_cpu_copy(old{mamba_old})",
        allocate_source(ctx, len(picks), "new"),
        *(
            [f"new = new[{order}]  # reload targets in this order"]
            if order is not None and order != sorted(order)
            else []
        ),
        "allocator.free(old_all)",
        f"{call}.load_cpu_copy(snapshot, new{mamba_new})",
        f"idx = {picks}",
    ]
    if words[0] == "mamba":
        steps.append("assert torch.equal(pool.get_mamba_state(layer)[1][new_m], want)")
    elif words[-1] in ("index_k", "index_k_scale"):
        steps += [
            "got_keys, got_scales = pool.get_index_k_scale_buffer(layer, new)",
            "assert torch.equal(got_keys.view(torch.uint8), keys[idx].view(torch.uint8))",
            "assert torch.equal(got_scales.reshape(-1), scales[idx])",
        ]
    elif words[-1] == "mla":
        steps += [
            "nope, rope = pool.get_mla_kv_buffer(Layer(layer), new)",
            "assert torch.equal(torch.cat([nope, rope], -1), k[idx].to(pool.dtype))",
        ]
    else:
        if Capability.SLIDING_WINDOW in ctx.capabilities and layer in tuple(pool.swa_layer_ids):
            steps.append("rows = pool.translate_loc_from_full_to_swa(new)")
        elif Capability.HISPARSE in ctx.capabilities:
            steps.append("rows = pool.translate_loc_to_device(new)")
        else:
            steps.append("rows = new")
        getter = "get_value_buffer" if words[-1] == "value" else "get_key_buffer"
        want = "v[idx]" if words[-1] == "value" else "k[idx]"
        if words[-1] == "value" and Capability.MLA in ctx.capabilities:
            want = "k[idx][..., : pool.kv_lora_rank]"
        steps.append(
            f"assert torch.equal(pool.{getter}(layer)[rows], {want}.to(pool.{getter}(layer).dtype))"
        )
    return steps


@behaviour_check("offload-roundtrip", requires=frozenset({Capability.OFFLOAD}), hint=ROUNDTRIP_HINT)
def offload_roundtrip(ctx: CheckContext) -> None:
    """Offload, free, reload at new slots: bit-exact, for runs, shuffled, single and whole-page
    slot sets, through the pool and the allocator, with and without ``mamba_indices`` (and,
    with a sliding window or HiSparse, with the first page out of the window or off the
    device); then the resumed request decodes a token."""
    page = int(ctx.config.page_size)
    states = [False, True] if Capability.MAMBA_STATE in ctx.capabilities else [False]
    evicts = [False]
    if Capability.SLIDING_WINDOW in ctx.capabilities:
        evicts.append(True)  # free_swa is part of the capability: never skipped
    elif ctx.capabilities & _EVICTABLE:
        # free_device is the built-in HiSparse allocator's documented extra, not the contract's.
        _, allocator = ctx.build()
        if callable(getattr(allocator, _evict_call(ctx), None)):
            evicts.append(True)
    salt = 100
    for pattern in _patterns(page):
        for through in ("pool", "allocator"):
            for with_state in states:
                for evict in evicts:
                    salt += 1
                    _roundtrip(ctx, pattern, through, with_state, salt, evict)


def _parts(snapshot: KVSnapshot, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a snapshot and its children, by path (``children.full.k``)."""
    found = {f"{prefix}{name}": t for name, t in snapshot.parts.items()}
    for child_name, child in snapshot.children.items():
        if child is not None:
            found.update(_parts(child, f"{prefix}{child_name}."))
    return found


def _changed_part(
    kept: dict[str, torch.Tensor], now: dict[str, torch.Tensor], slots: torch.Tensor
) -> str | None:
    """Which snapshot part changed, and where: parts are ``[layers, n, ...]`` or ``[n]``."""
    for name, old in kept.items():
        new = now[name]
        if same_bits(old, new):
            continue
        if old.shape != new.shape or old.dim() == 0 or old.numel() == 0:
            return f"part {name!r} changed"
        layers, entries = (1, old.shape[0]) if old.dim() == 1 else (old.shape[0], old.shape[1])
        a = old.contiguous().reshape(layers, entries, -1).view(torch.uint8)
        b = new.contiguous().reshape(layers, entries, -1).view(torch.uint8)
        layer, entry = (int(i) for i in (~a.eq(b).all(-1)).nonzero()[0].tolist())
        slot = f" = slot {int(slots[entry])}" if entry < slots.numel() else ""
        where = f"layer index {layer}, " if old.dim() > 1 else ""
        return f"part {name!r} changed at {where}entry {entry}{slot}"
    return None


@behaviour_check("snapshot-is-copy", requires=frozenset({Capability.OFFLOAD}), hint=COPY_HINT)
def snapshot_is_copy(ctx: CheckContext) -> None:
    """Writes to the pool after ``get_cpu_copy`` leave the snapshot as it was, and writes to
    the snapshot's tensors after ``load_cpu_copy`` leave the pool as it was."""
    page = int(ctx.config.page_size)
    for number, (order, _) in enumerate(
        slot_orders(torch.arange(page + 3), page, ctx.generator(71))
    ):
        _snapshot_is_copy(ctx, order, number)


def _snapshot_is_copy(ctx: CheckContext, order: str, number: int) -> None:
    """One slot order of ``snapshot-is-copy``, on a fresh pool."""
    pool, allocator = ctx.build()
    gen = ctx.generator(71)
    fill_everything(ctx, pool, gen)
    page = int(pool.page_size)
    n = page + 3  # with the reload's slots, within the smallest pool side the battery builds
    allocated = allocate(ctx, allocator, n)
    slots = slot_orders(allocated, page, ctx.generator(71))[number][1]
    dev = pool.device
    mamba = None
    if Capability.MAMBA_STATE in ctx.capabilities:
        mamba = mamba_request_slots(allocator, pool, 2, set())
    snapshot = pool.get_cpu_copy(slots.to(dev), mamba_indices=None if mamba is None else mamba)
    kept = {name: t.detach().to("cpu", copy=True) for name, t in _parts(snapshot).items()}
    write_state_rows(ctx, pool, slots, gen, mamba_slots=mamba)
    now = {name: t.detach().to("cpu", copy=True) for name, t in _parts(snapshot).items()}
    where = _changed_part(kept, now, slots)
    mamba_arg = ", mamba_indices=torch.tensor([1, 2])" if mamba is not None else ""
    first = attention_layer_ids(ctx.config)[0]
    if where is not None:
        raise BehaviourFailure(
            f"writing the pool at {order} {slots.tolist()} after get_cpu_copy changed the "
            f"snapshot (it shares memory with the pool): {where}",
            reproduction=ctx.reproduction(
                [
                    allocate_source(ctx, n, "allocated"),
                    f"slots = torch.tensor({slots.tolist()})",
                    f"snapshot = pool.get_cpu_copy(slots{mamba_arg})",
                    "kept = {n: t.clone() for n, t in snapshot.parts.items()}",
                    "kept.update({f'{c}.{n}': t.clone() for c, s in snapshot.children.items() "
                    "if s is not None for n, t in s.parts.items()})",
                    f"layer = {first}",
                    "k = torch.full((len(slots), *pool.get_key_buffer(layer).shape[1:]), 7.0)",
                    "v = torch.full((len(slots), *pool.get_value_buffer(layer).shape[1:]), 7.0)",
                    "pool.set_kv_buffer(Layer(layer), slots, k, v)",
                    "now = dict(snapshot.parts)",
                    "now.update({f'{c}.{n}': t for c, s in snapshot.children.items() "
                    "if s is not None for n, t in s.parts.items()})",
                    "assert all(torch.equal(kept[n], now[n]) for n in kept)",
                ]
            ),
            hint=COPY_HINT,
        )
    new = allocate(ctx, allocator, slots.numel())
    new_m = None
    if mamba is not None:
        new_m = mamba_request_slots(allocator, pool, 2, {int(s) for s in mamba.tolist()})
    pool.load_cpu_copy(snapshot, new.to(dev), mamba_indices=None if new_m is None else new_m)
    before = capture(pool, ctx.config, ctx.capabilities)
    for tensor in _parts(snapshot).values():
        if tensor.dtype == torch.bool:
            tensor.logical_not_()
        elif tensor.is_floating_point():
            tensor.add_(3)
        else:
            tensor.bitwise_xor_(0x5A)
    where = first_difference(before, capture(pool, ctx.config, ctx.capabilities))
    if where is not None:
        raise BehaviourFailure(
            f"writing into the snapshot's tensors after load_cpu_copy at slots {new.tolist()} "
            f"(offloaded from {order} {slots.tolist()}) changed the pool (it kept the "
            f"snapshot's memory): {where}",
            reproduction=ctx.reproduction(
                [
                    allocate_source(ctx, n, "allocated"),
                    f"slots = torch.tensor({slots.tolist()})",
                    f"snapshot = pool.get_cpu_copy(slots{mamba_arg})",
                    allocate_source(ctx, slots.numel(), "new"),
                    "pool.load_cpu_copy(snapshot, new"
                    + (", mamba_indices=torch.tensor([3, 4])" if new_m is not None else "")
                    + ")",
                    f"layer = {first}",
                    "before = pool.get_key_buffer(layer).clone()",
                    "for t in snapshot.parts.values():",
                    "    t.add_(3) if t.is_floating_point() else None",
                    "assert torch.equal(pool.get_key_buffer(layer), before)",
                ]
            ),
            hint=COPY_HINT,
        )
