"""The composite scaffolds (``--kind swa``, ``--kind hisparse``) as generated: their allocators,
built on ``CompositeAllocator`` over two ``PagedSlotAllocator``s, follow the token side's free
verdicts. A free takes the second side's slots out of the table at once; an applied free gives
them back exactly once, a rejected one (a double free, a slot named twice) changes nothing on
either side; backup/restore brings back both sides and the table. Both are paged: a full (or
logical) page owns at most one window (or device) page, at the same offsets.
"""

from __future__ import annotations

import importlib
import sys
from types import SimpleNamespace

import pytest
import torch

from kvcache_core import DoubleFreeError, KVCacheError, PoolConfig
from kvcache_core.commands.scaffold import render

_HISPARSE = dict(size=16, layer_num=1, kv_lora_rank=4, qk_rope_head_dim=2, hisparse_ratio=2)
# kind -> (config, table attribute, "no second slot" value, counts of the two sides)
_KINDS = {
    "swa": (
        dict(size=16, layer_num=2, head_num=1, head_dim=4, swa_layer_ids=(1,), swa_size=12),
        "full_to_swa_index_mapping",
        0,
        ("full_available_size", "swa_available_size"),
    ),
    "hisparse": (
        _HISPARSE,
        "logical_to_device",
        -1,
        ("logical_available_size", "device_available_size"),
    ),
}
_CASES = [("swa", 1), ("swa", 4), ("hisparse", 1), ("hisparse", 4)]


def _generate(kind, module, tmp_path, monkeypatch):
    for relative, text in render(
        module.replace("_", "-"), module, kind, requirement="kvcache"
    ).items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(module)


@pytest.fixture
def generated_module(tmp_path, monkeypatch):
    made: list[str] = []

    def make(kind):
        module = f"scaffold_composite_{kind}"
        made.append(module)
        return _generate(kind, module, tmp_path, monkeypatch)

    yield make
    for module in made:
        sys.modules.pop(module, None)
        sys.modules.pop(f"{module}.allocator", None)


@pytest.fixture(params=_CASES, ids=[f"{k}-P{p}" for k, p in _CASES])
def generated(request, generated_module):
    kind, page = request.param
    plugin = generated_module(kind)
    config, table, empty, sizes = _KINDS[kind]
    pool, alloc = plugin.create(PoolConfig(dtype=torch.float32, page_size=page, **config))
    return SimpleNamespace(
        pool=pool, alloc=alloc, table=getattr(alloc, table), empty=empty, sizes=sizes, P=page
    )


def _counts(g):
    return tuple(getattr(g.alloc, name)() for name in g.sizes)


def test_an_applied_free_releases_both_sides_once(generated):
    g, P = generated, generated.P
    before = _counts(g)
    slots = g.alloc.alloc(3 * P)
    assert slots is not None and bool((g.table[slots] > 0).all())
    assert _counts(g) == (before[0] - 3 * P, before[1] - 3 * P)
    g.alloc.free(slots[: 2 * P])
    assert bool((g.table[slots[: 2 * P]] == g.empty).all())  # out of reach before the verdict
    assert _counts(g) == (before[0] - P, before[1] - P)
    g.alloc.free(slots[2 * P :])
    assert _counts(g) == before


def test_a_double_free_is_rejected_and_changes_nothing_on_either_side(generated):
    g, P = generated, generated.P
    slots = g.alloc.alloc(3 * P)
    g.alloc.free(slots[:1])
    g.alloc.check_frees()
    counts, table = _counts(g), g.table.clone()
    g.alloc.free(slots[:1])  # a double free: reported at the settle
    with pytest.raises(DoubleFreeError):
        g.alloc.check_frees()
    assert _counts(g) == counts
    assert torch.equal(g.table, table)
    g.alloc.free(torch.stack([slots[P], slots[0]]))  # slots[0] is free: rejected whole
    with pytest.raises(KVCacheError):
        g.alloc.check_frees()
    assert _counts(g) == counts
    assert torch.equal(g.table, table)  # the held entries went back
    assert int(g.table[slots[P]]) > 0


def test_a_rejected_call_before_an_applied_one_in_the_same_batch(generated):
    g, P = generated, generated.P
    before = _counts(g)
    slots = g.alloc.alloc(2 * P)
    g.alloc.free_group_begin()
    g.alloc.free(torch.tensor([int(slots[0]), 10_000]))  # rejected: an id out of range
    g.alloc.free(slots[:P])  # applied: the page (and its second side) go after all
    g.alloc.free(slots[P:])
    g.alloc.free_group_end()
    with pytest.raises(KVCacheError):
        g.alloc.check_frees()
    assert _counts(g) == before
    assert bool((g.table[slots] == g.empty).all())


def test_backup_and_restore_bring_back_both_sides_and_the_table(generated):
    g, P = generated, generated.P
    kept = g.alloc.alloc(2 * P)
    state = g.alloc.backup_state()
    counts, saved = _counts(g), g.table.clone()
    g.alloc.free(kept)
    g.alloc.alloc(3 * P)
    g.alloc.restore_state(state)
    assert _counts(g) == counts
    assert torch.equal(g.table, saved)
    g.alloc.clear()
    assert bool((g.table[P:-1] == g.empty).all())


@pytest.mark.parametrize("page", [1, 4])
def test_hisparse_residency_is_by_page_and_a_restore_refills_what_moved(page, generated_module):
    plugin = generated_module("hisparse")
    pool, alloc = plugin.create(PoolConfig(dtype=torch.float32, page_size=page, **_HISPARSE))
    layer = SimpleNamespace(layer_id=0)

    def write(slots, value):
        pool.set_kv_buffer(layer, slots, torch.full((slots.numel(), 1, 6), value), None)

    def read(slots):
        return pool.get_mla_kv_buffer(layer, slots)[0][:, 0, 0]

    a = alloc.alloc(page)
    write(a, 1.0)
    state = alloc.backup_state()
    alloc.free_device(a[:1])  # the whole page leaves the device
    assert bool((alloc.logical_to_device[a] == -1).all())
    assert alloc.device_available_size() == pool.device_size
    room = alloc.alloc(pool.device_size)  # reuses a's device page...
    write(room, 2.0)  # ...and overwrites its rows
    assert alloc.alloc_device(a) is None  # no device page left: nothing changes
    assert bool((alloc.logical_to_device[a] == -1).all())
    assert torch.equal(read(a), torch.full((page,), 1.0))  # the store still has a's rows
    alloc.restore_state(state)  # a resident again, at a device page 2.0 was written to
    assert bool((alloc.logical_to_device[a] > 0).all())
    assert torch.equal(read(a), torch.full((page,), 1.0))
    alloc.free_device(a)
    back = alloc.alloc_device(a[-1:])  # the page comes back whole, its rows copied
    assert back is not None and bool((alloc.logical_to_device[a] > 0).all())
    assert torch.equal(read(a), torch.full((page,), 1.0))


def test_hisparse_decode_continues_a_page_made_non_resident(generated_module):
    plugin = generated_module("hisparse")
    pool, alloc = plugin.create(PoolConfig(dtype=torch.float32, page_size=4, **_HISPARSE))
    layer = SimpleNamespace(layer_id=0)
    first = alloc.alloc_extend(torch.tensor([0]), torch.tensor([2]), torch.tensor([-1]), 2)
    pool.set_kv_buffer(layer, first, torch.full((2, 1, 6), 3.0), None)
    alloc.free_device(first)
    nxt = alloc.alloc_decode(torch.tensor([3]), first[-1:])
    assert int(nxt) == int(first[-1]) + 1  # the same page, the next offset
    assert bool((alloc.logical_to_device[first] > 0).all())  # resident again, rows copied
    assert torch.equal(pool.get_mla_kv_buffer(layer, first)[0][:, 0, 0], torch.full((2,), 3.0))


@pytest.mark.parametrize("page", [1, 4])
def test_swa_window_pages_follow_their_full_pages(page, generated_module):
    plugin = generated_module("swa")
    config = _KINDS["swa"][0]
    pool, alloc = plugin.create(PoolConfig(dtype=torch.float32, page_size=page, **config))
    mapping = alloc.full_to_swa_index_mapping
    first = alloc.alloc_extend(torch.tensor([0]), torch.tensor([3]), torch.tensor([-1]), 3)
    window = mapping[first]
    assert bool((window > 0).all()) and torch.equal(window % page, first % page)
    alloc.free_swa(first[:1])  # the token left the window: its whole page does (paged)
    gone = first[:page] if page > 1 else first[:1]
    assert bool((mapping[gone] == 0).all())
    assert alloc.swa_available_size() == pool.swa_size - (3 - gone.numel() if page == 1 else 0)
    nxt = alloc.alloc_decode(torch.tensor([4]), first[-1:])  # continues the page
    assert int(nxt) == int(first[-1]) + 1
    assert int(mapping[nxt]) > 0 and int(mapping[nxt]) % page == int(nxt) % page
    spare = alloc.alloc(page)
    alloc.free(spare)
    with pytest.raises(DoubleFreeError):
        alloc.free_swa(spare)  # freed (the verdict comes first)
    alloc.free(torch.cat([first, nxt]))
    assert alloc.swa_available_size() == pool.swa_size


def test_swa_reload_short_of_window_slots_changes_nothing(generated_module):
    plugin = generated_module("swa")
    config = _KINDS["swa"][0]
    _, alloc = plugin.create(PoolConfig(dtype=torch.float32, page_size=4, **config))
    mapping = alloc.full_to_swa_index_mapping
    old = alloc.alloc(8)
    snapshot = alloc.get_cpu_copy(old)  # every token has a window slot
    alloc.free(old)  # retracted
    new = alloc.alloc(8)
    alloc.free_swa(new)  # the reload target without window slots: 3 window pages free
    hog = alloc.alloc(8)  # 1 window page left; the reload needs 2
    before, free = mapping.clone(), alloc.swa_available_size()
    with pytest.raises(KVCacheError, match="window slot"):
        alloc.load_cpu_copy(snapshot, new)
    assert torch.equal(mapping, before) and alloc.swa_available_size() == free
    alloc.free(hog)
    alloc.load_cpu_copy(snapshot, new)
    assert bool((mapping[new] > 0).all())


def test_swa_reload_matches_the_mask_page_by_page_and_rolls_back_a_refusal(
    generated_module, monkeypatch
):
    plugin = generated_module("swa")
    config = _KINDS["swa"][0]
    pool, alloc = plugin.create(PoolConfig(dtype=torch.float32, page_size=4, **config))
    mapping = alloc.full_to_swa_index_mapping
    old = alloc.alloc(8)
    alloc.free_swa(old[:4])  # the first page left the window
    snapshot = alloc.get_cpu_copy(old)
    assert snapshot.parts["swa_mask"].tolist() == [False] * 4 + [True] * 4
    alloc.free(old)
    new = alloc.alloc(8)  # both pages get window pages
    before, free = mapping.clone(), alloc.swa_available_size()

    def refuse(*args, **kwargs):
        raise RuntimeError("the pool refused")

    monkeypatch.setattr(pool, "load_cpu_copy", refuse)
    with pytest.raises(RuntimeError, match="refused"):
        alloc.load_cpu_copy(snapshot, new)
    assert torch.equal(mapping, before) and alloc.swa_available_size() == free
    monkeypatch.undo()
    alloc.load_cpu_copy(snapshot, new)
    assert (mapping[new] > 0).tolist() == [False] * 4 + [True] * 4
    assert alloc.swa_available_size() == pool.swa_size - 4  # the unwanted page went back
