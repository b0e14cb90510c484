"""Head-major ``swa`` and ``mamba`` pools (``options["head_major"]``) are their row-major pools,
bit for bit.

Both composites keep their token rows in ``MHATokenToKVPool``s (the full and window sides of
``swa``, the attention side of ``mamba``), so the option may change memory order only. Hypothesis
state machines drive a row-major and a head-major pool, each with its own allocator, through the
same requests: writes of every location form (``KVWriteLoc(loc, swa_loc)`` included), tokens
leaving the window, retractions (``mamba_indices`` carrying the recurrent state) reloaded into
new slots from the *other* layout's snapshot, and frees. After every step both allocators must
have handed out the same slots and every buffer of every layer must hold the same bytes; every
snapshot pair must be identical. The behaviour battery, which builds one config per pool, is
run once more on head-major builds of every kind that takes the option.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from conftest import Layer
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcache_core import KVSnapshot, KVWriteLoc, PoolConfig, discover
from kvcache_core.conformance.behaviour import default_config, run_spec
from kvcache_core.conformance.results.model import Outcome
from kvcache_plugins import mamba, mha, swa
from kvcache_plugins.mamba import HybridMambaKVPool, MambaPool
from kvcache_plugins.swa import SWAKVPool

HEADS, DIM, LAYERS = 2, 4, 4
SIZE = 16  # full (token) slots; the window side has fewer, so it runs short first
DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn]


def raw(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes (fp8 and -0.0 compare as stored)."""
    return tensor.contiguous().view(torch.uint8)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(raw(a), raw(b))


def assert_same_snapshot(a: KVSnapshot | None, b: KVSnapshot | None) -> None:
    """Two snapshots are the same, part by part and child by child, in bytes."""
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    assert (a.pool_kind, a.dtype, a.token_count, a.meta) == (
        b.pool_kind,
        b.dtype,
        b.token_count,
        b.meta,
    )
    assert a.parts.keys() == b.parts.keys() and a.children.keys() == b.children.keys()
    for name, part in a.parts.items():
        assert same_bytes(part, b.parts[name]), name
    for name, child in a.children.items():
        assert_same_snapshot(child, b.children[name])


def rows_for(pool: Any, layer: int, n: int, seed: int, source: torch.dtype | None) -> Any:
    """Random K and V rows for ``n`` tokens of ``layer``: as stored when ``source`` is None
    (the hot write path, where the pool's dtype allows it), else in ``source`` (a cast)."""
    gen = torch.Generator().manual_seed(seed)
    k_buf, v_buf = pool.get_kv_buffer(layer)
    k = torch.randn(n, *k_buf.shape[1:], generator=gen)
    v = torch.randn(n, *v_buf.shape[1:], generator=gen)
    if source is None and pool.dtype != torch.float8_e4m3fn:
        return k.to(pool.dtype), v.to(pool.dtype)
    return (k, v) if source is None else (k.to(source), v.to(source))


class _SameAsRowMajor(RuleBasedStateMachine):
    """What both composite machines share: two pools (row-major, head-major) with their
    allocators, the live requests (full slots, page-aligned) and the whole-buffer invariant."""

    page_size: int
    pools: tuple[Any, Any]
    allocators: tuple[Any, Any]

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[torch.Tensor] = []

    def build(self, config: PoolConfig) -> None:
        factory = self.factory()
        built = [factory(replace(config, options={"head_major": m})) for m in (False, True)]
        self.pools = (built[0][0], built[1][0])
        self.allocators = (built[0][1], built[1][1])
        assert [p.head_major for p in self.pools] == [False, True]

    def factory(self) -> Any:
        raise NotImplementedError

    def alloc_both(self, n: int) -> torch.Tensor | None:
        got = [allocator.alloc(n) for allocator in self.allocators]
        assert (got[0] is None) == (got[1] is None)
        if got[0] is None or got[1] is None:
            return None
        assert torch.equal(got[0], got[1])  # same allocator, same history: the same slots
        return got[0]

    def layers(self) -> range:
        return range(LAYERS)

    def kv_layers(self) -> list[int]:
        raise NotImplementedError

    def write_everywhere(
        self,
        data: st.DataObject,
        layer: int,
        seed: int,
        source: torch.dtype | None,
        scale: float | None,
        where: Any,
    ) -> None:
        """The same rows written at the same slots of one live request in every pool;
        ``where(pool, loc)`` is the location form a rule passes."""
        request = data.draw(st.sampled_from(self.requests))
        picked = data.draw(st.lists(st.sampled_from(request.tolist()), min_size=1, unique=True))
        loc = torch.tensor(picked)
        for pool in self.pools:
            k, v = rows_for(pool, layer, len(picked), seed, source)
            pool.set_kv_buffer(Layer(layer), where(pool, loc), k, v, k_scale=scale, v_scale=scale)

    @rule(pages=st.integers(1, 3))
    def alloc(self, pages: int) -> None:
        slots = self.alloc_both(pages * self.page_size)
        if slots is not None:
            self.requests.append(slots)

    @precondition(lambda self: len(self.requests) > 1)  # one stays: every rule has one to use
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        request = self.requests.pop(data.draw(st.integers(0, len(self.requests) - 1)))
        for allocator in self.allocators:
            allocator.free(request)

    @invariant()
    def buffers_identical(self) -> None:
        if not hasattr(self, "pools"):
            return
        rows, heads = self.pools
        for layer in self.kv_layers():
            for a, b in zip(rows.get_kv_buffer(layer), heads.get_kv_buffer(layer), strict=True):
                assert same_bytes(a, b), f"layer {layer} differs between the layouts"


class SWASameAsRowMajor(_SameAsRowMajor):
    """A row-major and a head-major ``swa`` pool through the same workload."""

    def factory(self) -> Any:
        return swa.create

    def kv_layers(self) -> list[int]:
        return list(self.layers())

    @initialize(
        dtype=st.sampled_from(DTYPES), check=st.booleans(), page_size=st.sampled_from([1, 2])
    )
    def start(self, dtype: torch.dtype, check: bool, page_size: int) -> None:
        self.page_size = page_size
        self.build(
            PoolConfig(
                size=SIZE,
                layer_num=LAYERS,
                head_num=HEADS,
                head_dim=DIM,
                page_size=page_size,
                dtype=dtype,
                swa_layer_ids=(1, 3),
                swa_size=SIZE // 2,
                validate_write_slots=check,
            )
        )
        self.alloc(pages=2)

    @precondition(lambda self: self.requests)
    @rule(
        data=st.data(),
        layer=st.integers(0, LAYERS - 1),
        seed=st.integers(0, 2**16),
        source=st.sampled_from([None, torch.float64]),
        form=st.sampled_from(["bare", "writeloc", "swa_loc"]),
        scale=st.sampled_from([None, 2.0]),
    )
    def write(
        self,
        data: st.DataObject,
        layer: int,
        seed: int,
        source: torch.dtype | None,
        form: str,
        scale: float | None,
    ) -> None:
        def where(pool: Any, loc: torch.Tensor) -> Any:
            if form == "bare":
                return loc
            if form == "writeloc":
                return KVWriteLoc(loc)
            # the engine's own translation, as sglang passes it
            return KVWriteLoc(loc, swa_loc=pool.translate_loc_from_full_to_swa(loc))

        self.write_everywhere(data, layer, seed, source, scale, where)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def leave_window(self, data: st.DataObject) -> None:
        """The oldest pages of a request leave the window: their window slots are released."""
        request = data.draw(st.sampled_from(self.requests))
        pages = data.draw(st.integers(1, request.numel() // self.page_size))
        for allocator in self.allocators:
            allocator.free_swa(request[: pages * self.page_size])

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), cross=st.booleans())
    def retract_and_resume(self, data: st.DataObject, cross: bool) -> None:
        """Offload a request, free its slots, allocate new ones, reload (``cross``: each pool
        loads the other layout's snapshot)."""
        index = data.draw(st.integers(0, len(self.requests) - 1))
        request = self.requests.pop(index)
        snaps = [allocator.get_cpu_copy(request) for allocator in self.allocators]
        assert_same_snapshot(*snaps)
        for allocator in self.allocators:
            allocator.free(request)
        new = self.alloc_both(request.numel())
        if new is None:  # the window side ran short: nothing was taken, the snapshot is gone
            return
        for i, allocator in enumerate(self.allocators):
            allocator.load_cpu_copy(snaps[1 - i] if cross else snaps[i], new)
        self.requests.append(new)

    @invariant()
    def mappings_identical(self) -> None:
        if not hasattr(self, "pools"):
            return
        rows, heads = self.pools
        assert torch.equal(rows.full_to_swa_index_mapping, heads.full_to_swa_index_mapping)


class MambaSameAsRowMajor(_SameAsRowMajor):
    """A row-major and a head-major ``mamba`` pool through the same workload; each request
    also holds one request slot of recurrent state."""

    MAMBA_IDS = (0, 2)

    def factory(self) -> Any:
        return mamba.create

    def kv_layers(self) -> list[int]:
        return [i for i in self.layers() if i not in self.MAMBA_IDS]

    @initialize(
        dtype=st.sampled_from(DTYPES), check=st.booleans(), page_size=st.sampled_from([1, 2])
    )
    def start(self, dtype: torch.dtype, check: bool, page_size: int) -> None:
        self.page_size = page_size
        self.states: dict[int, torch.Tensor] = {}  # request id() -> its request slot
        self.build(
            PoolConfig(
                size=SIZE,
                layer_num=LAYERS,
                head_num=HEADS,
                head_dim=DIM,
                page_size=page_size,
                dtype=dtype,
                mamba_layer_ids=self.MAMBA_IDS,
                mamba_size=4,
                conv_state_shapes=((3, 2),),
                temporal_state_shape=(2, 3),
                validate_write_slots=check,
            )
        )
        self.start_request(pages=2, seed=0)

    @precondition(lambda self: self.requests)
    @rule(
        data=st.data(),
        layer=st.sampled_from([1, 3]),
        seed=st.integers(0, 2**16),
        source=st.sampled_from([None, torch.float64]),
        wrapped=st.booleans(),
        scale=st.sampled_from([None, 2.0]),
    )
    def write(
        self,
        data: st.DataObject,
        layer: int,
        seed: int,
        source: torch.dtype | None,
        wrapped: bool,
        scale: float | None,
    ) -> None:
        def where(pool: Any, loc: torch.Tensor) -> Any:
            return KVWriteLoc(loc) if wrapped else loc

        self.write_everywhere(data, layer, seed, source, scale, where)

    @rule(pages=st.integers(1, 3), seed=st.integers(0, 2**16))
    def start_request(self, pages: int, seed: int) -> None:
        """Token slots plus one request slot whose state is random (the same in both)."""
        got = [allocator.mamba_allocator.alloc(1) for allocator in self.allocators]
        if got[0] is None or got[1] is None:
            assert got[0] is None and got[1] is None
            return
        assert torch.equal(got[0], got[1])
        tokens = self.alloc_both(pages * self.page_size)
        if tokens is None:
            for allocator in self.allocators:
                allocator.mamba_allocator.free(got[0])
            return
        for pool in self.pools:
            gen = torch.Generator().manual_seed(seed)
            for layer in self.MAMBA_IDS:
                convs, temporal = pool.get_mamba_state(layer)
                for t in (*convs, temporal):
                    t[got[0]] = torch.randn(1, *t.shape[1:], generator=gen).to(t.dtype)
        self.requests.append(tokens)
        self.states[id(tokens)] = got[0]

    @precondition(lambda self: len(self.requests) > 1)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        request = self.requests.pop(data.draw(st.integers(0, len(self.requests) - 1)))
        slot = self.states.pop(id(request), None)
        for allocator in self.allocators:
            allocator.free(request)
            if slot is not None:
                allocator.mamba_allocator.free(slot)

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), cross=st.booleans())
    def retract_and_resume(self, data: st.DataObject, cross: bool) -> None:
        """Offload a request's KV (and its state, when it has a request slot), free both, take
        new ones and reload (``cross``: from the other layout's snapshot)."""
        request = self.requests.pop(data.draw(st.integers(0, len(self.requests) - 1)))
        slot = self.states.pop(id(request), None)
        snaps = [a.get_cpu_copy(request, mamba_indices=slot) for a in self.allocators]
        assert_same_snapshot(*snaps)
        assert (snaps[0].children["mamba"] is None) == (slot is None)
        for allocator in self.allocators:
            allocator.free(request)
            if slot is not None:
                allocator.mamba_allocator.free(slot)
        new = self.alloc_both(request.numel())
        assert new is not None  # what was just freed is free again
        new_slot = None
        if slot is not None:
            taken = [a.mamba_allocator.alloc(1) for a in self.allocators]
            assert taken[0] is not None and taken[1] is not None
            assert torch.equal(taken[0], taken[1])
            new_slot = taken[0]
        for i, allocator in enumerate(self.allocators):
            allocator.load_cpu_copy(
                snaps[1 - i] if cross else snaps[i], new, mamba_indices=new_slot
            )
        self.requests.append(new)
        if new_slot is not None:
            self.states[id(new)] = new_slot

    @invariant()
    def states_identical(self) -> None:
        if not hasattr(self, "pools"):
            return
        rows, heads = self.pools
        for layer in self.MAMBA_IDS:
            (a_convs, a_temporal), (b_convs, b_temporal) = (
                rows.get_mamba_state(layer),
                heads.get_mamba_state(layer),
            )
            for a, b in zip((*a_convs, a_temporal), (*b_convs, b_temporal), strict=True):
                assert same_bytes(a, b), f"state of layer {layer} differs"


_SETTINGS = settings(max_examples=60, stateful_step_count=16, deadline=None)
TestSWASameAsRowMajor = SWASameAsRowMajor.TestCase
TestSWASameAsRowMajor.settings = _SETTINGS
TestMambaSameAsRowMajor = MambaSameAsRowMajor.TestCase
TestMambaSameAsRowMajor.settings = _SETTINGS


# -- the option --------------------------------------------------------------------------------
def swa_config(**options: object) -> PoolConfig:
    return PoolConfig(
        size=8,
        layer_num=2,
        head_num=HEADS,
        head_dim=DIM,
        swa_layer_ids=(1,),
        swa_size=4,
        options=options,
    )


def mamba_config(**options: object) -> PoolConfig:
    return PoolConfig(
        size=8,
        layer_num=2,
        head_num=HEADS,
        head_dim=DIM,
        mamba_layer_ids=(0,),
        mamba_size=2,
        temporal_state_shape=(2, 3),
        options=options,
    )


def each_head_contiguous(buffer: torch.Tensor) -> bool:
    return buffer.transpose(0, 1).is_contiguous()


@pytest.mark.parametrize("via_registry", [False, True], ids=["factory", "registry"])
def test_swa_keeps_both_sides_head_major_when_asked(via_registry: bool) -> None:
    build = (lambda c: discover().create("swa", c)) if via_registry else swa.create
    pool, _ = build(swa_config(head_major=True))
    assert pool.head_major and pool.full_pool.head_major and pool.swa_pool.head_major
    assert each_head_contiguous(pool.get_key_buffer(0))  # a full layer
    assert each_head_contiguous(pool.get_value_buffer(1))  # a window layer
    plain, _ = build(swa_config())
    assert not plain.head_major and not plain.full_pool.head_major
    assert not plain.swa_pool.head_major
    assert not each_head_contiguous(plain.get_key_buffer(1))


@pytest.mark.parametrize("via_registry", [False, True], ids=["factory", "registry"])
def test_mamba_keeps_its_attention_rows_head_major_when_asked(via_registry: bool) -> None:
    build = (lambda c: discover().create("mamba", c)) if via_registry else mamba.create
    pool, _ = build(mamba_config(head_major=True))
    assert pool.head_major and pool.attention_pool.head_major
    assert each_head_contiguous(pool.get_key_buffer(1))
    plain, _ = build(mamba_config())
    assert not plain.head_major and not plain.attention_pool.head_major
    assert not each_head_contiguous(plain.get_key_buffer(1))


@pytest.mark.parametrize("value", ["yes", 1, 0, None, torch.tensor(True)])
def test_a_non_bool_option_is_refused_with_the_mha_message(value: object) -> None:
    """One parser: every kind refuses the same values with the very same message."""
    messages = []
    for create, config in (
        (mha.create, PoolConfig(size=8, layer_num=1, options={"head_major": value})),
        (swa.create, swa_config(head_major=value)),
        (mamba.create, mamba_config(head_major=value)),
    ):
        with pytest.raises(TypeError, match=r"options\['head_major'\] must be a bool") as caught:
            create(config)
        messages.append(str(caught.value))
    assert len(set(messages)) == 1, messages


def test_the_constructor_keyword_defaults_to_row_major_and_reaches_every_inner_pool() -> None:
    window = SWAKVPool(8, 4, 1, torch.float32, HEADS, DIM, 2, (1,))
    assert window.head_major is False and not window.swa_pool.head_major
    window = SWAKVPool(8, 4, 1, torch.float32, HEADS, DIM, 2, (1,), head_major=True)
    assert window.full_pool.head_major and window.swa_pool.head_major
    state = MambaPool(2, (0,), (), (2, 3))
    hybrid = HybridMambaKVPool(8, 1, torch.float32, HEADS, DIM, 2, state)
    assert hybrid.head_major is False and not hybrid.attention_pool.head_major
    hybrid = HybridMambaKVPool(8, 1, torch.float32, HEADS, DIM, 2, state, head_major=True)
    assert hybrid.attention_pool.head_major


@pytest.mark.parametrize("kind", ["mha", "swa", "mamba"])
def test_the_behaviour_battery_passes_on_head_major_builds(kind: str) -> None:
    """The battery has one config per spec (``PoolSpec.behaviour_config``): run it once more
    with ``head_major`` on, and see that every pool it built was head-major."""
    spec = discover().spec(kind)
    built: list[Any] = []

    def recording(config: PoolConfig) -> Any:
        pool, allocator = spec.factory(config)
        built.append(pool)
        return pool, allocator

    config = replace(default_config(spec), options={"head_major": True})
    results = run_spec(replace(spec, factory=recording, behaviour_config=config))
    failed = [(r.check, r.findings) for r in results if r.outcome is not Outcome.PASSED]
    assert results and not failed
    assert built and all(pool.head_major for pool in built)
