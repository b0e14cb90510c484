"""Issue 7 acceptance: every pool's state machine compares whole buffers after every step, and
no rejected call changes a byte. The machinery lives in ``_whole_buffers.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
import torch
from hypothesis import HealthCheck, settings

from kvcache_core import KVCacheError, KVSnapshot, KVWriteLoc

from ._whole_buffers import (
    HARNESSES,
    Harness,
    Layer,
    MambaHarness,
    assert_same_buffers,
    clone_all,
    machine,
)

MACHINE_SETTINGS = settings(
    derandomize=True,
    max_examples=12,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _case(kind: str, page_size: int) -> type:
    case = machine(kind, page_size).TestCase
    case.settings = MACHINE_SETTINGS
    return case


TestMHAPage1 = _case("mha", 1)
TestMHAPage2 = _case("mha", 2)
TestMLAPage1 = _case("mla", 1)
TestMLAPage2 = _case("mla", 2)
TestDSAPage1 = _case("dsa", 1)
TestDSAPage4 = _case("dsa", 4)
TestHiSparsePage1 = _case("hisparse", 1)
TestHiSparsePage2 = _case("hisparse", 2)
TestSWAPage1 = _case("swa", 1)
TestSWAPage2 = _case("swa", 2)
TestSWAPage4 = _case("swa", 4)
TestMambaPage1 = _case("mamba", 1)
TestMambaPage2 = _case("mamba", 2)


# -- nothing stored changes when a call is rejected ----------------------------------------------
@dataclass
class Ctx:
    """A pool with two written requests, a valid snapshot of one and new slots to load it."""

    h: Harness
    req: torch.Tensor
    new: torch.Tensor
    snap: KVSnapshot
    mamba_slot: torch.Tensor | None


def _context(kind: str) -> Ctx:
    h = HARNESSES[kind](2)
    gen = torch.Generator().manual_seed(3)
    req = h.alloc.alloc(4)
    other = h.alloc.alloc(2)
    h.write(req, "bare", gen)
    h.write(other, "bare", gen)
    mamba_slot = None
    if isinstance(h, MambaHarness):
        mamba_slot = h.alloc.mamba_allocator.alloc(1)
        h.write_state(int(mamba_slot[0]), gen)
    snap = h.alloc.get_cpu_copy(req, mamba_indices=mamba_slot)
    new = h.alloc.alloc(4)
    return Ctx(h, req, new, snap, mamba_slot)


def _every_byte(h: Harness) -> dict[str, torch.Tensor]:
    out = clone_all(h.buffers())
    for name in ("full_to_swa_index_mapping", "logical_to_device"):
        table = getattr(h.alloc, name, None)
        if table is not None:
            out[name] = table.clone()
    return out


def _first_layer(h: Harness) -> int:
    return h.pool.attention_layer_ids[0] if isinstance(h, MambaHarness) else h.pool.start_layer


def _kv_rows(h: Harness, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = h.pool.get_kv_buffer(_first_layer(h))
    return torch.zeros(n, *k.shape[1:]), torch.zeros(n, *v.shape[1:])


def _set_kv(loc: object, k_extra: int = 0, rows: int | None = None, dtype=None, layer=None):
    def call(c: Ctx) -> None:
        n = rows if rows is not None else (loc.numel() if isinstance(loc, torch.Tensor) else 2)
        k, v = _kv_rows(c.h, n)
        if k_extra:
            k = torch.zeros(*k.shape[:-1], k.shape[-1] + k_extra)
        if dtype is not None:
            k = k.to(dtype)
        lid = _first_layer(c.h) if layer is None else layer
        c.h.pool.set_kv_buffer(Layer(lid), loc, k, v)

    return call


def _swa_loc(swa_loc: torch.Tensor):
    def call(c: Ctx) -> None:
        k, v = (torch.zeros(2, *t.shape[1:]) for t in c.h.pool.get_kv_buffer(1))
        c.h.pool.set_kv_buffer(Layer(1), KVWriteLoc(loc=c.new[:2], swa_loc=swa_loc), k, v)

    return call


def _get(indices: object, mamba_indices: object = None):
    return lambda c: c.h.alloc.get_cpu_copy(indices, mamba_indices=mamba_indices)


def _load(indices=None, snap=None, mamba="same", via="alloc"):
    def call(c: Ctx) -> None:
        target = c.h.alloc if via == "alloc" else c.h.pool
        idx = c.new if indices is None else (indices(c) if callable(indices) else indices)
        s = c.snap if snap is None else snap(c)
        m = c.mamba_slot if mamba == "same" else (mamba(c) if callable(mamba) else mamba)
        target.load_cpu_copy(s, idx, mamba_indices=m)

    return call


def _bent(snap: KVSnapshot, retype: bool = False) -> KVSnapshot:
    """The same snapshot with rows one element narrower (another geometry), or in another
    dtype (``retype``): in the first child of a composite snapshot, else in its last part."""
    children = [name for name, child in sorted(snap.children.items()) if child is not None]
    if children:
        child = snap.children[children[0]]
        assert child is not None
        return replace(snap, children={**snap.children, children[0]: _bent(child, retype)})
    name = sorted(snap.parts)[-1]
    t = snap.parts[name]
    bent = t.to(torch.float64) if retype else t.reshape(*t.shape[:2], -1)[..., :-1]
    return replace(snap, parts={**snap.parts, name: bent})


def _mask_flipped(snap: KVSnapshot) -> KVSnapshot:
    """An SWA snapshot whose mask marks one token more than its window part holds."""
    mask = snap.parts["swa_mask"].clone()
    mask[0] = ~mask[0]
    return replace(snap, parts={"swa_mask": mask})


def _foreign(c: Ctx) -> KVSnapshot:
    other = "mla" if c.h.kind == "mha" else "mha"
    h = HARNESSES[other](2)
    return h.alloc.get_cpu_copy(h.alloc.alloc(4))


COMMON: dict[str, Callable[[Ctx], object]] = {
    "write: slot out of range": _set_kv(torch.tensor([10_000, 2])),
    "write: negative slot": _set_kv(torch.tensor([-1, 2])),
    "write: float slot ids": _set_kv(torch.tensor([2.0, 3.0])),
    "write: 2-D slots": _set_kv(torch.tensor([[2, 3]]), rows=2),
    "write: slots not a tensor": _set_kv([2, 3]),
    "write: wrong row shape": _set_kv(torch.tensor([2, 3]), k_extra=1),
    "write: row count": _set_kv(torch.tensor([2, 3]), rows=3),
    "write: integer rows": _set_kv(torch.tensor([2, 3]), dtype=torch.int32),
    "write: unknown layer": _set_kv(torch.tensor([2, 3]), layer=99),
    "write: layer without an id": lambda c: c.h.pool.set_kv_buffer(
        object(), torch.tensor([2]), *_kv_rows(c.h, 1)
    ),
    "get: out of range": _get(torch.tensor([10_000])),
    "get: negative": _get(torch.tensor([-1])),
    "get: padding slot 0": _get(torch.tensor([0, 2])),
    "get: duplicates": _get(torch.tensor([2, 2])),
    "get: float ids": _get(torch.tensor([2.0])),
    "load: out of range": _load(lambda c: torch.cat([c.new[:-1], torch.tensor([10_000])])),
    "load: negative": _load(lambda c: torch.cat([c.new[:-1], torch.tensor([-3])])),
    "load: padding slot 0": _load(lambda c: torch.cat([c.new[:-1], torch.tensor([0])])),
    "load: duplicates": _load(lambda c: torch.cat([c.new[:-1], c.new[:1]])),
    "load: float ids": _load(lambda c: c.new.double()),
    "load: token count": _load(lambda c: c.new[:-1]),
    "load: another kind": _load(snap=_foreign),
    "load: another dtype": _load(snap=lambda c: replace(c.snap, dtype=torch.float64)),
    "load: another geometry": _load(snap=lambda c: _bent(c.snap)),
    "load: a part in another dtype": _load(snap=lambda c: _bent(c.snap, retype=True)),
    "load: not a snapshot": _load(snap=lambda c: {"k": torch.zeros(1)}),
    "pool load: duplicates": _load(lambda c: torch.cat([c.new[:-1], c.new[:1]]), via="pool"),
    "pool load: another geometry": _load(snap=lambda c: _bent(c.snap), via="pool"),
}


def _mla_write(loc: object, nope_extra: int = 0, layer=None, dtype=None):
    def call(c: Ctx) -> None:
        pool = c.h.pool
        n = loc.numel() if isinstance(loc, torch.Tensor) else 2
        nope = torch.zeros(n, 1, pool.kv_lora_rank + nope_extra)
        rope = torch.zeros(n, 1, pool.qk_rope_head_dim)
        if dtype is not None:
            rope = rope.to(dtype)
        lid = pool.start_layer if layer is None else layer
        pool.set_mla_kv_buffer(Layer(lid), loc, nope, rope)

    return call


def _index_write(loc: object, key_extra: int = 0, scales: int | None = None, layer=None):
    def call(c: Ctx) -> None:
        pool = c.h.pool
        n = loc.numel() if isinstance(loc, torch.Tensor) else 2
        keys = torch.zeros(n, pool.index_head_dim + key_extra).to(pool.index_dtype)
        scale = torch.ones(n if scales is None else scales)
        pool.set_index_k_scale_buffer(
            pool.start_layer if layer is None else layer, loc, keys, scale
        )

    return call


LATENT: dict[str, Callable[[Ctx], object]] = {
    "mla write: out of range": _mla_write(torch.tensor([2, 10_000])),
    "mla write: negative": _mla_write(torch.tensor([-2, 2])),
    "mla write: float ids": _mla_write(torch.tensor([2.0, 3.0])),
    "mla write: wrong nope shape": _mla_write(torch.tensor([2, 3]), nope_extra=1),
    "mla write: integer rope": _mla_write(torch.tensor([2, 3]), dtype=torch.int64),
    "mla write: unknown layer": _mla_write(torch.tensor([2, 3]), layer=99),
}
INDEXER: dict[str, Callable[[Ctx], object]] = {
    "index write: out of range": _index_write(torch.tensor([2, 10_000])),
    "index write: negative": _index_write(torch.tensor([2, -1])),
    "index write: float ids": _index_write(torch.tensor([2.0, 3.0])),
    "index write: wrong key shape": _index_write(torch.tensor([2, 3]), key_extra=1),
    "index write: scale count": _index_write(torch.tensor([2, 3]), scales=3),
    "index write: unknown layer": _index_write(torch.tensor([2, 3]), layer=99),
}
WINDOW: dict[str, Callable[[Ctx], object]] = {
    "window write: swa_loc out of range": _swa_loc(torch.tensor([2, 10_000])),
    "window write: negative swa_loc": _swa_loc(torch.tensor([-1, 2])),
    "window write: float swa_loc": _swa_loc(torch.tensor([1.0, 2.0])),
    "load: mask and window part disagree": _load(snap=lambda c: _mask_flipped(c.snap)),
    "pool load: mask and window part disagree": _load(
        snap=lambda c: _mask_flipped(c.snap), via="pool"
    ),
}
STATE: dict[str, Callable[[Ctx], object]] = {
    "get: mamba_indices out of range": _get(torch.tensor([2]), torch.tensor([99])),
    "get: mamba_indices duplicated": _get(torch.tensor([2]), torch.tensor([1, 1])),
    "get: mamba_indices float": _get(torch.tensor([2]), torch.tensor([1.0])),
    "load: state saved, mamba_indices missing": _load(mamba=None),
    "load: no state saved, mamba_indices given": _load(
        snap=lambda c: c.h.alloc.get_cpu_copy(c.req), mamba=lambda c: c.mamba_slot
    ),
    "load: mamba_indices count": _load(mamba=lambda c: torch.tensor([1, 2])),
    "load: mamba_indices duplicated": _load(mamba=lambda c: torch.tensor([1, 1])),
    "load: mamba_indices padding slot 0": _load(mamba=lambda c: torch.tensor([0])),
    "load: mamba_indices out of range": _load(mamba=lambda c: torch.tensor([99])),
    "load: state of another layout": _load(snap=lambda c: _bent_state(c.snap)),
}


def _bent_state(snap: KVSnapshot) -> KVSnapshot:
    state = snap.children["mamba"]
    assert state is not None
    return replace(snap, children={**snap.children, "mamba": _bent(state)})


def _table() -> list[tuple[str, str]]:
    rows = []
    for kind in HARNESSES:
        cases = dict(COMMON)
        if kind in ("mla", "dsa", "hisparse"):
            cases.update(LATENT)
        if kind in ("dsa", "hisparse"):
            cases.update(INDEXER)
        if kind == "swa":
            cases.update(WINDOW)
        if kind == "mamba":
            cases.update(STATE)
        rows += [(kind, name) for name in cases]
    return rows


ALL_CASES = {**COMMON, **LATENT, **INDEXER, **WINDOW, **STATE}


@pytest.mark.parametrize(("kind", "case"), _table())
def test_a_rejected_call_raises_a_kvcache_error_and_changes_no_byte(kind, case):
    ctx = _context(kind)
    before = _every_byte(ctx.h)
    with pytest.raises(KVCacheError):
        ALL_CASES[case](ctx)
    assert_same_buffers(_every_byte(ctx.h), before)
