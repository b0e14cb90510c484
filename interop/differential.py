"""Differential run: sglang 0.5.14's pools against kvcache's, same seeded operations (CPU).

Run by ``make interop`` inside a virtualenv that has sglang installed with ``--no-deps``; the
project itself never imports sglang. Two kinds of comparison:

- **sequences**: seeded random operations (alloc, write through bare slots and ``KVWriteLoc``,
  writes with scales that cast and that do not, free, free groups, backup/restore, window
  eviction, offload and reload at new slots) on MHA with the token allocator, SWA and the Mamba
  hybrid. Both sides must agree on accounting, window bookkeeping and every live token's rows.
  They stay inside the behaviour both pools define, so any difference is undocumented.
- **probes**: one small scenario per row of docs/engines.md's "Coming from sglang" table, each
  reporting the row's id when the two sides differ.

Then ``kvcache check`` runs every level on sglang's pools and allocators registered as a
kvcache plugin (``interop/sglang_plugin``), and each finding's id (``interop/findings.py``)
must be in the same table.

Every divergence or finding whose id is not in that table is printed; the exit status is 0
only when there is none. Rows whose difference was not observed are listed (not an error).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import _stubs  # noqa: E402
from findings import Comparison, documented_ids, is_checker_id, result_ids, run_checker  # noqa: E402

# sglang's own torch path for move_kv_cache (its default is a triton kernel, GPU only)
os.environ.setdefault("SGLANG_NATIVE_MOVE_KV_CACHE", "1")

_stubs.install(hollow=_stubs.SGLANG_HOLLOW, forced=_stubs.SGLANG_FORCED)

import torch  # noqa: E402
from sglang.srt.configs.mamba_utils import (  # noqa: E402
    Mamba2CacheParams,
    Mamba2StateDType,
    Mamba2StateShape,
)
from sglang.srt.mem_cache import memory_pool as sg_memory_pool  # noqa: E402
from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402

from kvcache_core import KVWriteLoc, PoolConfig, discover  # noqa: E402

SIZE, SWA_SIZE, HEADS, DIM, LAYERS = 24, 12, 2, 4, 2
DTYPE = torch.float32
REGISTRY = discover()


class Layer:
    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id


class Divergences:
    """Divergence ids found, with one example each."""

    def __init__(self) -> None:
        self.found: dict[str, str] = {}

    def add(self, key: str, detail: str) -> None:
        self.found.setdefault(key, detail)


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", result) or ("raised", exception type name)."""
    try:
        return "ok", call()
    except Exception as exc:  # a probe compares whether each side raised
        return "raised", type(exc).__name__


# -- builders --------------------------------------------------------------------------------
def sg_mha(layers: int = LAYERS) -> tuple[Any, Any]:
    pool = sg_memory_pool.MHATokenToKVPool(
        size=SIZE,
        page_size=1,
        dtype=DTYPE,
        head_num=HEADS,
        head_dim=DIM,
        layer_num=layers,
        device="cpu",
        enable_memory_saver=False,
    )
    return pool, TokenToKVPoolAllocator(SIZE, DTYPE, "cpu", pool, need_sort=False)


def kv_mha(layers: int = LAYERS) -> tuple[Any, Any]:
    config = PoolConfig(
        size=SIZE, layer_num=layers, head_num=HEADS, head_dim=DIM, page_size=1, dtype=DTYPE
    )
    return REGISTRY.create("mha", config)


def sg_swa() -> tuple[Any, Any]:
    pool = SWAKVPool(
        size=SIZE,
        size_swa=SWA_SIZE,
        page_size=1,
        dtype=DTYPE,
        head_num=HEADS,
        head_dim=DIM,
        swa_attention_layer_ids=[1],
        full_attention_layer_ids=[0],
        enable_kvcache_transpose=False,
        device="cpu",
    )
    allocator = SWATokenToKVPoolAllocator(SIZE, SWA_SIZE, 1, DTYPE, "cpu", pool, need_sort=False)
    return pool, allocator


def kv_swa() -> tuple[Any, Any]:
    config = PoolConfig(
        size=SIZE,
        layer_num=2,
        head_num=HEADS,
        head_dim=DIM,
        page_size=1,
        dtype=DTYPE,
        swa_layer_ids=(1,),
        swa_size=SWA_SIZE,
    )
    return REGISTRY.create("swa", config)


MAMBA_SLOTS, CONV, TEMPORAL = 4, (2, 3), (1, 2, 2)


def sg_mamba() -> tuple[Any, Any, Any]:
    shape = Mamba2StateShape(
        conv=[CONV],
        temporal=TEMPORAL,
        intermediate_size=0,
        conv_dim=CONV[0],
        ssm_state_size=TEMPORAL[-1],
        num_heads=TEMPORAL[0],
        head_dim=TEMPORAL[1],
        state_size=TEMPORAL[-1],
        conv_kernel=CONV[1] + 1,
    )
    params = Mamba2CacheParams(
        shape=shape,
        layers=[1],
        dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32),
    )
    mamba = sg_memory_pool.MambaPool(
        size=MAMBA_SLOTS, spec_state_size=0, cache_params=params, mamba_layer_ids=[1], device="cpu"
    )
    pool = sg_memory_pool.HybridLinearKVPool(
        size=SIZE,
        dtype=DTYPE,
        page_size=1,
        head_num=HEADS,
        head_dim=DIM,
        full_attention_layer_ids=[0],
        enable_kvcache_transpose=False,
        device="cpu",
        mamba_pool=mamba,
    )
    allocator = TokenToKVPoolAllocator(SIZE, DTYPE, "cpu", pool, need_sort=False)
    return pool, allocator, MambaSlotAllocator(MAMBA_SLOTS, "cpu")


def kv_mamba() -> tuple[Any, Any, Any]:
    config = PoolConfig(
        size=SIZE,
        layer_num=2,
        head_num=HEADS,
        head_dim=DIM,
        page_size=1,
        dtype=DTYPE,
        mamba_layer_ids=(1,),
        mamba_size=MAMBA_SLOTS,
        conv_state_shapes=(CONV,),
        temporal_state_shape=TEMPORAL,
    )
    pool, allocator = REGISTRY.create("mamba", config)
    return pool, allocator, allocator.mamba_allocator


def sg_state(pool: Any, slot: int) -> list[torch.Tensor]:
    cache = pool.mamba_pool.mamba_cache
    return [cache.conv[0][0, slot].clone(), cache.temporal[0, slot].clone()]


def kv_state(pool: Any, slot: int) -> list[torch.Tensor]:
    conv, temporal = pool.get_mamba_state(1)
    return [conv[0][slot].clone(), temporal[slot].clone()]


def set_sg_state(pool: Any, slot: int, values: list[torch.Tensor]) -> None:
    cache = pool.mamba_pool.mamba_cache
    cache.conv[0][0, slot] = values[0]
    cache.temporal[0, slot] = values[1]


def set_kv_state(pool: Any, slot: int, values: list[torch.Tensor]) -> None:
    conv, temporal = pool.get_mamba_state(1)
    conv[0][slot] = values[0]
    temporal[slot] = values[1]


# -- sequences ---------------------------------------------------------------------------------
class Side:
    """One engine's pool, allocator and its own slots for each live request."""

    def __init__(self, name: str, pool: Any, allocator: Any, mamba: Any = None) -> None:
        self.name, self.pool, self.allocator, self.mamba = name, pool, allocator, mamba
        self.requests: dict[int, torch.Tensor] = {}
        self.request_slot: dict[int, torch.Tensor] = {}

    def rows(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer in getattr(self.pool, "swa_layer_ids", ()) or (
            self.name == "sglang" and hasattr(self.pool, "swa_kv_pool") and layer == 1
        ):
            slots = self.allocator.translate_loc_from_full_to_swa(slots)
        return self.pool.get_key_buffer(layer)[slots], self.pool.get_value_buffer(layer)[slots]


def run_sequence(kind: str, seed: int, steps: int, out: Divergences) -> None:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    if kind == "mha":
        sides = [Side("sglang", *sg_mha()), Side("kvcache", *kv_mha())]
    elif kind == "swa":
        sides = [Side("sglang", *sg_swa()), Side("kvcache", *kv_swa())]
    else:
        sides = [Side("sglang", *sg_mamba()), Side("kvcache", *kv_mamba())]
    window = kind == "swa"
    layers = [0, 1] if kind != "mamba" else [0]
    evicted: set[int] = set()  # requests whose first token left the window
    # layers each request has written since it was allocated: fresh slots hold whatever the
    # last owner left, which differs between sides (their free lists are their own business)
    written: dict[int, set[int]] = {}
    backup: tuple[list[Any], dict[int, torch.Tensor], dict[int, torch.Tensor], set[int]] | None
    backup = None
    next_id = 0

    def where(step: int, op: str) -> str:
        return f"{kind} seed {seed} step {step} ({op})"

    for step in range(steps):
        op = rng.choice(
            ["alloc", "alloc", "write", "write", "free", "group", "offload", "backup", "evict"]
        )
        live = sorted(sides[0].requests)
        if op == "alloc":
            n = rng.randint(1, 5)
            got = [s.allocator.alloc(n) for s in sides]
            if (got[0] is None) != (got[1] is None):
                out.add(f"random-{kind}-alloc", where(step, f"alloc({n}): {got}"))
                return
            if got[0] is not None:
                if kind == "mamba":
                    slot = [s.mamba.alloc(1) for s in sides]
                    if (slot[0] is None) != (slot[1] is None):
                        out.add(f"random-{kind}-mamba-alloc", where(step, "mamba alloc"))
                        return
                    if slot[0] is None:
                        for s, g in zip(sides, got, strict=True):
                            s.allocator.free(g)
                        continue
                    state = [torch.randn(CONV, generator=gen), torch.randn(TEMPORAL, generator=gen)]
                    set_sg_state(sides[0].pool, int(slot[0]), state)
                    set_kv_state(sides[1].pool, int(slot[1]), state)
                    for s, one in zip(sides, slot, strict=True):
                        s.request_slot[next_id] = one.reshape(-1)[:1]
                for s, g in zip(sides, got, strict=True):
                    s.requests[next_id] = g
                written[next_id] = set()
                next_id += 1
        elif op == "write" and live:
            rid = rng.choice(live)
            n = len(sides[0].requests[rid])
            cast = rng.random() < 0.3
            scale = rng.choice([None, 2.0])
            for layer in layers:
                k = torch.randint(-8, 8, (n, HEADS, DIM), generator=gen) / 2
                v = torch.randint(-8, 8, (n, HEADS, DIM), generator=gen) / 2
                if cast:
                    k, v = k.double(), v.double()
                bundle = rng.random() < 0.5
                for s in sides:
                    slots = s.requests[rid]
                    record = sg_memory_pool.KVWriteLoc if s.name == "sglang" else KVWriteLoc
                    if window and layer == 1:  # sglang requires swa_loc on window layers
                        swa_loc = s.allocator.translate_loc_from_full_to_swa(slots)
                        loc: Any = record(slots, swa_loc=swa_loc)
                    elif bundle:
                        loc = record(slots)
                    else:
                        loc = slots
                    # sglang divides a casting write in place: give each side its own copy
                    args = (k.clone(), v.clone()) + ((scale, scale) if scale else ())
                    s.pool.set_kv_buffer(Layer(layer), loc, *args)
                written[rid].add(layer)
        elif op == "free" and live:
            rid = rng.choice(live)
            for s in sides:
                s.allocator.free(s.requests.pop(rid))
                if kind == "mamba":
                    s.mamba.free(s.request_slot.pop(rid))
            evicted.discard(rid)
        elif op == "group" and len(live) >= 2:
            chosen = rng.sample(live, 2)
            for s in sides:
                s.allocator.free_group_begin()
                for rid in chosen:
                    s.allocator.free(s.requests.pop(rid))
                    if kind == "mamba":
                        s.mamba.free(s.request_slot.pop(rid))
                s.allocator.free_group_end()
            evicted -= set(chosen)
        elif op == "evict" and window and live:
            rid = rng.choice(live)
            for s in sides:
                s.allocator.free_swa(s.requests[rid][:1])
            evicted.add(rid)
        elif op == "backup":
            if backup is None or rng.random() < 0.5:
                backup = (
                    [s.allocator.backup_state() for s in sides],
                    dict(sides[0].requests),
                    dict(sides[1].requests),
                    set(evicted),
                )
            elif kind != "swa" and kind != "mamba":
                # sglang's SWA restore leaks window slots ("swa-backup-table"), and the Mamba
                # slot allocator has no backup: restore only on plain MHA
                states, sg_reqs, kv_reqs, ev = backup
                for s, st in zip(sides, states, strict=True):
                    s.allocator.restore_state(st)
                # a request freed since the backup is live again, but later allocations may
                # have reused and overwritten its slots (each side in its own order): its rows
                # are undefined in both engines until it writes again
                for rid in set(sg_reqs) - set(sides[0].requests):
                    written[rid] = set()
                sides[0].requests, sides[1].requests, evicted = dict(sg_reqs), dict(kv_reqs), ev
                backup = None
        elif op == "offload" and live:
            candidates = [r for r in live if r not in evicted]  # see "swa-reload-window-slots"
            if not candidates:
                continue
            rid = rng.choice(candidates)
            snaps = []
            for s in sides:
                mamba_idx = s.request_slot.get(rid)
                snaps.append(s.allocator.get_cpu_copy(s.requests[rid], mamba_indices=mamba_idx))
                s.allocator.free(s.requests.pop(rid))
                if mamba_idx is not None:
                    s.mamba.free(s.request_slot.pop(rid))
            for s, snap in zip(sides, snaps, strict=True):
                new = s.allocator.alloc(len_of(snap, s.name, kind))
                mamba_new = s.mamba.alloc(1) if kind == "mamba" else None
                if new is None or (kind == "mamba" and mamba_new is None):
                    out.add(f"random-{kind}-reload-alloc", where(step, "no room to reload"))
                    return
                s.allocator.load_cpu_copy(snap, new, mamba_indices=mamba_new)
                s.requests[rid] = new
                if mamba_new is not None:
                    s.request_slot[rid] = mamba_new.reshape(-1)[:1]
            # backups taken before the offload no longer describe the requests
            backup = None
        compare(kind, sides, written, where(step, op), out)
        if any(k.startswith(f"random-{kind}") for k in out.found):
            return


def len_of(snapshot: Any, side: str, kind: str) -> int:
    if side == "kvcache":
        return int(snapshot.token_count)
    if kind == "mha":
        return int(sum(len(chunk[0]) for chunk in snapshot[0]))
    if kind == "swa":
        return len(snapshot["swa_mask"])
    kv, _ = snapshot
    return int(sum(len(chunk[0]) for chunk in kv[0]))


def compare(
    kind: str, sides: list[Side], written: dict[int, set[int]], at: str, out: Divergences
) -> None:
    sg, kv = sides
    if sg.allocator.available_size() != kv.allocator.available_size():
        out.add(
            f"random-{kind}-available-size",
            f"{at}: {sg.allocator.available_size()} vs {kv.allocator.available_size()}",
        )
    if kind == "swa":
        for what in ("full_available_size", "swa_available_size"):
            a, b = getattr(sg.allocator, what)(), getattr(kv.allocator, what)()
            if a != b:
                out.add(f"random-swa-{what}", f"{at}: {a} vs {b}")
    for rid, sg_slots in sg.requests.items():
        kv_slots = kv.requests[rid]
        if kind == "swa":
            a = sg.allocator.translate_loc_from_full_to_swa(sg_slots) > 0
            b = kv.allocator.translate_loc_from_full_to_swa(kv_slots) > 0
            if not torch.equal(a, b):
                out.add("random-swa-window-mask", f"{at}: request {rid}: {a} vs {b}")
                continue
        for layer in sorted(written[rid]):
            mask = torch.ones(len(sg_slots), dtype=torch.bool)
            if kind == "swa" and layer == 1:
                mask = sg.allocator.translate_loc_from_full_to_swa(sg_slots) > 0
            a_k, a_v = sg.rows(layer, sg_slots)
            b_k, b_v = kv.rows(layer, kv_slots)
            if not (torch.equal(a_k[mask], b_k[mask]) and torch.equal(a_v[mask], b_v[mask])):
                out.add(f"random-{kind}-rows", f"{at}: request {rid} layer {layer}")
        if kind == "mamba":
            a = sg_state(sg.pool, int(sg.request_slot[rid]))
            b = kv_state(kv.pool, int(kv.request_slot[rid]))
            if not all(torch.equal(x, y) for x, y in zip(a, b, strict=True)):
                out.add("random-mamba-state", f"{at}: request {rid}")


# -- probes: one per documented difference -------------------------------------------------------
def probe_scales(out: Divergences) -> None:
    for build in (sg_mha, kv_mha):
        pool, _ = build()
        k = torch.full((1, HEADS, DIM), 3.0, dtype=torch.float64)
        pool.set_kv_buffer(Layer(0), torch.tensor([1]), k, k.clone(), 2.0, 2.0)
        if build is sg_mha and float(k[0, 0, 0]) != 3.0:
            out.add("scales-in-place", f"sglang left the caller's cache_k at {float(k[0, 0, 0])}")
    values = []
    for build in (sg_mha, kv_mha):
        pool, _ = build()
        k = torch.full((1, HEADS, DIM), 3.0)
        pool.set_kv_buffer(Layer(0), torch.tensor([1]), k, k.clone(), 2.0, 2.0)
        values.append(float(pool.get_key_buffer(0)[1, 0, 0]))
    if values[0] != values[1]:
        out.add("write-scales", f"no-cast write with k_scale=2.0 stored {values}")


def probe_snapshots(out: Divergences) -> None:
    for name, sg_build, kv_build in (("mha", sg_mha, kv_mha), ("swa", sg_swa, kv_swa)):
        types = []
        for build in (sg_build, kv_build):
            _, allocator = build()
            types.append(type(allocator.get_cpu_copy(allocator.alloc(2))).__name__)
        if types[0] != types[1]:
            out.add("snapshot-type", f"{name}: {types}")
    kinds = []
    for small, big in ((sg_mha, sg_mha), (kv_mha, kv_mha)):
        p1, a1 = small(1)
        pool, a2 = big(2)
        saved = a1.alloc(2)
        ones = torch.ones((2, HEADS, DIM))
        p1.set_kv_buffer(Layer(0), saved, ones, ones.clone())
        snap = a1.get_cpu_copy(saved)
        slots = a2.alloc(2)
        before = pool.get_key_buffer(0).clone()
        result, _ = outcome(lambda a2=a2, snap=snap, slots=slots: a2.load_cpu_copy(snap, slots))
        kinds.append((result, torch.equal(before, pool.get_key_buffer(0))))
    if kinds[0] != kinds[1]:
        out.add("snapshot-layers", f"(outcome, layer 0 unchanged): {kinds}")


def probe_swa(out: Divergences) -> None:
    # a window-layer write without swa_loc
    results = []
    for build in (sg_swa, kv_swa):
        pool, allocator = build()
        slots = allocator.alloc(2)
        k = torch.ones((2, HEADS, DIM))
        results.append(outcome(lambda p=pool, s=slots, k=k: p.set_kv_buffer(Layer(1), s, k, k))[0])
    if results[0] != results[1]:
        out.add("swa-write-without-swa-loc", str(results))
    # pool reload whose new tokens have no window slot
    results = []
    for build in (sg_swa, kv_swa):
        pool, allocator = build()
        slots = allocator.alloc(2)
        snap = allocator.get_cpu_copy(slots)
        allocator.free(slots)
        new = allocator.alloc(2)
        allocator.free_swa(new)
        results.append(outcome(lambda p=pool, s=snap, n=new: p.load_cpu_copy(s, n))[0])
    if results[0] != results[1]:
        out.add("swa-reload-missing-window-slot", str(results))
    # allocator reload of tokens that had left the window
    masks = []
    for build in (sg_swa, kv_swa):
        _, allocator = build()
        slots = allocator.alloc(2)
        allocator.free_swa(slots)
        snap = allocator.get_cpu_copy(slots)
        allocator.free(slots)
        new = allocator.alloc(2)
        allocator.load_cpu_copy(snap, new)
        masks.append((allocator.translate_loc_from_full_to_swa(new) > 0).tolist())
    if masks[0] != masks[1]:
        out.add("swa-reload-window-slots", f"window slots after reload: {masks}")
    # backup/restore and the window table
    sizes = []
    for build in (sg_swa, kv_swa):
        _, allocator = build()
        state = allocator.backup_state()
        slots = allocator.alloc(3)
        allocator.restore_state(state)
        table = allocator.translate_loc_from_full_to_swa(slots)
        sizes.append((allocator.swa_available_size(), table.tolist()))
    if sizes[0] != sizes[1]:
        out.add("swa-backup-table", f"(window free, table) after restore: {sizes}")
    # move_kv_cache from a token that left the window
    rows = []
    for build in (sg_swa, kv_swa):
        pool, allocator = build()
        src, tgt = allocator.alloc(1), allocator.alloc(1)
        for slots, value in ((src, 1.0), (tgt, 2.0)):
            k = torch.full((1, HEADS, DIM), value)
            swa_loc = allocator.translate_loc_from_full_to_swa(slots)
            loc_type = sg_memory_pool.KVWriteLoc if build is sg_swa else KVWriteLoc
            pool.set_kv_buffer(Layer(1), loc_type(slots, swa_loc=swa_loc), k, k)
        allocator.free_swa(src)
        pool.move_kv_cache(tgt, src)
        window = allocator.translate_loc_from_full_to_swa(tgt)
        rows.append(float(pool.get_key_buffer(1)[window][0, 0, 0]))
    if rows[0] != rows[1]:
        out.add("swa-move-outside-window", f"target window row after the move: {rows}")


def probe_mamba(out: Divergences) -> None:
    results = []
    for build in (sg_mamba, kv_mamba):
        _, allocator, slots_alloc = build()
        slots = allocator.alloc(2)
        request = slots_alloc.alloc(1)
        snap = allocator.get_cpu_copy(slots, mamba_indices=request)
        new = allocator.alloc(2)
        results.append(
            outcome(lambda a=allocator, s=snap, n=new: a.load_cpu_copy(s, n, mamba_indices=None))[0]
        )
    if results[0] != results[1]:
        out.add("mamba-indices-mismatch", f"state saved, reload without mamba_indices: {results}")


def probe_bad_input(out: Divergences) -> None:
    def both(key: str, action: Callable[[Any, Any], Any]) -> None:
        results = []
        for build in (sg_mha, kv_mha):
            pool, allocator = build()
            results.append(outcome(lambda p=pool, a=allocator: action(p, a))[0])
        if results[0] != results[1]:
            out.add(key, f"(sglang, kvcache): {results}")

    def double_free(_: Any, a: Any) -> None:
        slots = a.alloc(2)
        a.free(slots)
        a.free(slots)
        a.available_size()

    def settle(a: Any, slots: torch.Tensor) -> None:
        a.free(slots)
        a.available_size()

    def nested(_: Any, a: Any) -> None:
        a.free_group_begin()
        a.free_group_begin()

    def foreign(_: Any, a: Any) -> None:
        _, other = kv_mha() if type(a).__module__.startswith("kvcache") else sg_mha()
        a.restore_state(other.backup_state())

    def write(p: Any, slots: list[int], dtype: torch.dtype = DTYPE) -> None:
        k = torch.ones((len(slots), HEADS, DIM), dtype=dtype)
        p.set_kv_buffer(Layer(0), torch.tensor(slots), k, k)

    both("alloc-negative", lambda _, a: a.alloc(-1))
    both("double-free", double_free)
    both("free-padding-slot", lambda _, a: settle(a, torch.tensor([0])))
    both("free-out-of-range", lambda _, a: settle(a, torch.tensor([SIZE + 100])))
    both("nested-free-group", nested)
    both("foreign-restore-state", foreign)
    both("write-slot-minus-one", lambda p, _: write(p, [-1]))
    both("integer-k", lambda p, _: write(p, [1], torch.int64))
    both("offload-bad-indices", lambda _, a: (a.alloc(2), a.get_cpu_copy(torch.tensor([1, 1]))))
    both("offload-bad-indices", lambda _, a: (a.alloc(2), a.get_cpu_copy(torch.tensor([0, 1]))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--verbose", action="store_true", help="show each documented divergence")
    parser.add_argument(
        "--no-checker",
        action="store_true",
        help="skip `kvcache check` (every level) on sglang's pools registered as a plugin",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = Divergences()
    for kind in ("mha", "swa", "mamba"):
        for seed in range(args.seeds):
            try:
                run_sequence(kind, seed, args.steps, out)
            except Exception as exc:  # report, keep going: a crash on one side is a divergence
                out.add(f"random-{kind}-raised", f"seed {seed}: {type(exc).__name__}: {exc}")
    for probe in (probe_scales, probe_snapshots, probe_swa, probe_mamba, probe_bad_input):
        try:
            probe(out)
        except Exception as exc:
            out.add(f"probe-{probe.__name__}-raised", f"{type(exc).__name__}: {exc}")
    table = documented_ids()
    documented = {k for k in table if not is_checker_id(k)}
    undocumented = {k: v for k, v in out.found.items() if k not in documented}
    seen = sorted(k for k in out.found if k in documented)
    print(f"sequences: {args.seeds} seeds x {args.steps} steps on mha, swa, mamba")
    print(f"documented divergences observed ({len(seen)}): {', '.join(seen) or 'none'}")
    unseen = sorted(documented - set(out.found))
    if unseen:
        print(f"documented, not observed in this run: {', '.join(unseen)}")
    if args.verbose:
        for key in seen:
            print(f"  {key}: {out.found[key]}")
    for key, detail in sorted(undocumented.items()):
        print(f"UNDOCUMENTED {key}: {detail}")
    checker_ok = True
    if not args.no_checker:
        checker_ids = {k for k in table if is_checker_id(k)}
        comparison = Comparison(result_ids(run_checker("sglang")), checker_ids)
        print("kvcache check sglang (every level, sglang's pools as a plugin):")
        for line in comparison.report(unseen_from=checker_ids):
            print(f"  {line}")
        checker_ok = comparison.ok
    ok = not undocumented and checker_ok
    print("ok: every divergence is documented" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
