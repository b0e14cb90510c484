"""The composite scaffolds (``--kind swa``, ``--kind hisparse``) as generated: their allocators,
built on ``CompositeAllocator`` over two ``PagedSlotAllocator``s, follow the token side's free
verdicts. A free takes the second side's slot out of the table at once; an applied free gives
it back exactly once, a rejected one (a double free, a slot named twice) changes nothing on
either side; backup/restore brings back both sides and the table.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from kvcache_core import DoubleFreeError, KVCacheError, PoolConfig
from kvcache_core.scaffold import render

# kind -> (config, table attribute, "no second slot" value, counts of the two sides)
_KINDS = {
    "swa": (
        dict(size=8, layer_num=2, head_num=1, head_dim=4, swa_layer_ids=(1,), swa_size=6),
        "full_to_swa_index_mapping",
        0,
        ("full_available_size", "swa_available_size"),
    ),
    "hisparse": (
        dict(size=4, layer_num=1, kv_lora_rank=4, qk_rope_head_dim=2, hisparse_ratio=2),
        "logical_to_device",
        -1,
        ("logical_available_size", "device_available_size"),
    ),
}


@pytest.fixture(params=sorted(_KINDS))
def generated(request, tmp_path, monkeypatch):
    kind = request.param
    module = f"scaffold_composite_{kind}"
    for relative, text in render(f"c-{kind}", module, kind, requirement="kvcache").items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        plugin = importlib.import_module(module)
        config, table, empty, sizes = _KINDS[kind]
        _pool, alloc = plugin.create(PoolConfig(dtype=torch.float32, **config))
        yield alloc, getattr(alloc, table), empty, sizes
    finally:
        sys.modules.pop(module, None)
        sys.modules.pop(f"{module}.allocator", None)


def _counts(alloc, sizes):
    return tuple(getattr(alloc, name)() for name in sizes)


def test_an_applied_free_releases_both_sides_once(generated):
    alloc, table, empty, sizes = generated
    before = _counts(alloc, sizes)
    slots = alloc.alloc(3)
    assert slots is not None and bool((table[slots] > 0).all())
    assert _counts(alloc, sizes) == (before[0] - 3, before[1] - 3)
    alloc.free(slots[:2])
    assert bool((table[slots[:2]] == empty).all())  # out of reach before the verdict
    assert _counts(alloc, sizes) == (before[0] - 1, before[1] - 1)
    alloc.free(slots[2:])
    assert _counts(alloc, sizes) == before


def test_a_double_free_is_rejected_and_changes_nothing_on_either_side(generated):
    alloc, table, _empty, sizes = generated
    slots = alloc.alloc(3)
    alloc.free(slots[:1])
    alloc.check_frees()
    after_first = (_counts(alloc, sizes), table.clone())
    alloc.free(slots[:1])  # a double free: reported at the settle
    with pytest.raises(DoubleFreeError):
        alloc.check_frees()
    assert _counts(alloc, sizes) == after_first[0]
    assert torch.equal(table, after_first[1])
    alloc.free(torch.stack([slots[1], slots[1]]))  # one slot named twice: rejected whole
    with pytest.raises(KVCacheError):
        alloc.check_frees()
    assert _counts(alloc, sizes) == after_first[0]
    assert torch.equal(table, after_first[1])  # the held entry went back
    assert int(table[slots[1]]) > 0


def test_a_rejected_call_after_an_applied_one_in_the_same_batch(generated):
    alloc, table, empty, sizes = generated
    before = _counts(alloc, sizes)
    slots = alloc.alloc(2)
    alloc.free_group_begin()
    alloc.free(torch.stack([slots[0], slots[0]]))  # rejected
    alloc.free(slots[:1])  # applied: the slot (and its second side) go after all
    alloc.free(slots[1:])
    alloc.free_group_end()
    with pytest.raises(KVCacheError):
        alloc.check_frees()
    assert _counts(alloc, sizes) == before
    assert bool((table[slots] == empty).all())


def test_backup_and_restore_bring_back_both_sides_and_the_table(generated):
    alloc, table, empty, sizes = generated
    kept = alloc.alloc(2)
    state = alloc.backup_state()
    counts, saved = _counts(alloc, sizes), table.clone()
    alloc.free(kept)
    alloc.alloc(3)
    alloc.restore_state(state)
    assert _counts(alloc, sizes) == counts
    assert torch.equal(table, saved)
    alloc.clear()
    assert bool((table[1:-1] == empty).all())


def test_a_page_size_other_than_one_is_refused(tmp_path, monkeypatch):
    for kind, (config, *_) in _KINDS.items():
        module = f"scaffold_paged_{kind}"
        for relative, text in render(f"p-{kind}", module, kind, requirement="kvcache").items():
            path = tmp_path / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        monkeypatch.syspath_prepend(str(tmp_path))
        try:
            plugin = importlib.import_module(module)
            with pytest.raises(ValueError, match="page_size must be 1, got 2"):
                plugin.create(PoolConfig(page_size=2, **config))
        finally:
            sys.modules.pop(module, None)
            sys.modules.pop(f"{module}.allocator", None)
