"""A head-major MHA pool (``options["head_major"]``) is the row-major pool, bit for bit.

Memory order is the only difference the option may make: the same writes (hot path, casts,
scales, ``KVWriteLoc``), moves, offloads and reloads must leave every buffer and every
snapshot identical to a row-major pool's, and a snapshot of either layout loads into the
other. A hypothesis state machine drives both side by side against that model; the hot write
path of ``set_kv_buffer`` gets every bad input the checked path refuses.
"""

from __future__ import annotations

import pytest
import torch
from conftest import Layer
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvcache_core import (
    InvalidSlotError,
    KVWriteLoc,
    LayerRows,
    PoolConfig,
    ShapeMismatchError,
    discover,
)
from kvcache_plugins.mha import MHATokenToKVPool, create

SIZE, HEADS, DIM, LAYERS = 12, 2, 4, 2
DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn]


def pools(dtype: torch.dtype, check: bool) -> tuple[MHATokenToKVPool, MHATokenToKVPool]:
    """A row-major and a head-major pool, alike in everything else."""
    return tuple(  # type: ignore[return-value]
        MHATokenToKVPool(
            SIZE, 1, dtype, HEADS, DIM, LAYERS, check_write_slots=check, head_major=major
        )
        for major in (False, True)
    )


def raw(buffer: torch.Tensor) -> torch.Tensor:
    """A buffer's bytes (fp8 compares as its stored bytes)."""
    return buffer.contiguous().view(torch.uint8)


class SameAsRowMajor(RuleBasedStateMachine):
    """Every operation applied to three pools: the model (row-major, every write through the
    checked path) and a row-major and a head-major pool whose writes may take the hot path.
    All three must stay equal."""

    @initialize(dtype=st.sampled_from(DTYPES), check=st.booleans())
    def start(self, dtype: torch.dtype, check: bool) -> None:
        model = MHATokenToKVPool(SIZE, 1, dtype, HEADS, DIM, LAYERS, check_write_slots=True)
        self.model = model
        self.pools = (model, *pools(dtype, check))

    @rule(
        slots=st.lists(st.integers(0, SIZE), min_size=1, max_size=5, unique=True),
        layer=st.integers(0, LAYERS - 1),
        seed=st.integers(0, 2**16),
        source=st.sampled_from([None, torch.float64]),
        wrapped=st.booleans(),
        scale=st.sampled_from([None, 2.0]),
    )
    def write(
        self,
        slots: list[int],
        layer: int,
        seed: int,
        source: torch.dtype | None,
        wrapped: bool,
        scale: float | None,
    ) -> None:
        gen = torch.Generator().manual_seed(seed)
        n = len(slots)
        k, v = torch.randn(n, HEADS, DIM, generator=gen), torch.randn(n, HEADS, DIM, generator=gen)
        dtype = self.model.dtype
        if source is None and dtype != torch.float8_e4m3fn:
            k, v = k.to(dtype), v.to(dtype)  # the hot path: rows as stored
        elif source is not None:
            k, v = k.to(source), v.to(source)
        loc = torch.tensor(slots)
        for pool in self.pools:
            where = KVWriteLoc(loc) if wrapped else loc
            pool.set_kv_buffer(Layer(layer), where, k, v, k_scale=scale, v_scale=scale)

    @rule(
        src=st.lists(st.integers(1, SIZE), min_size=1, max_size=4, unique=True),
        shift=st.integers(1, 5),
    )
    def move(self, src: list[int], shift: int) -> None:
        tgt = [(s + shift - 1) % SIZE + 1 for s in src]
        for pool in self.pools:
            pool.move_kv_cache(torch.tensor(tgt), torch.tensor(src))

    @rule(
        out=st.lists(st.integers(1, SIZE), min_size=1, max_size=6, unique=True),
        into=st.permutations(list(range(1, SIZE + 1))),
        cross=st.booleans(),
    )
    def offload_and_reload(self, out: list[int], into: list[int], cross: bool) -> None:
        snaps = [pool.get_cpu_copy(torch.tensor(out)) for pool in self.pools]
        for snap in snaps[1:]:
            for a, b in zip(snaps[0].parts.values(), snap.parts.values(), strict=True):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        target = torch.tensor(into[: len(out)])
        # ``cross``: each pool loads the next one's snapshot (the other layout's, for two).
        for i, pool in enumerate(self.pools):
            pool.load_cpu_copy(snaps[(i + 1) % 3] if cross else snaps[i], target)

    @invariant()
    def buffers_identical(self) -> None:
        for pool in self.pools[1:]:
            for layer in range(LAYERS):
                want, got = self.model.get_kv_buffer(layer), pool.get_kv_buffer(layer)
                for a, b in zip(want, got, strict=True):
                    assert a.shape == b.shape and torch.equal(raw(a), raw(b))


TestSameAsRowMajor = SameAsRowMajor.TestCase
TestSameAsRowMajor.settings = settings(max_examples=40, stateful_step_count=12, deadline=None)


def test_each_head_is_one_contiguous_block_of_slots() -> None:
    """What the option is for: ``[slots, heads, dim]`` over ``[heads, slots, dim]`` memory."""
    _, pool = pools(torch.float32, False)
    key = pool.get_key_buffer(0)
    assert key.shape == (SIZE + 1, HEADS, DIM)
    assert key.transpose(0, 1).is_contiguous()
    rows, _ = pools(torch.float32, False)
    assert not rows.get_key_buffer(0).transpose(0, 1).is_contiguous()


BAD = [
    ({"loc": torch.tensor([1, 2], dtype=torch.int32)}, None),  # not int64: the checked path
    ({"loc": torch.tensor([[1, 2]])}, InvalidSlotError),
    ({"loc": torch.tensor([1, SIZE + 1])}, InvalidSlotError),
    ({"k": torch.zeros(3, HEADS, DIM)}, ShapeMismatchError),
    ({"v": torch.zeros(2, HEADS + 1, DIM)}, ShapeMismatchError),
    ({"k": torch.zeros(2, HEADS, DIM, dtype=torch.int64)}, ShapeMismatchError),
    ({"loc": [1, 2]}, InvalidSlotError),
]


@pytest.mark.parametrize(("bad", "error"), BAD)
def test_the_hot_write_path_refuses_what_the_checked_path_refuses(
    bad: dict[str, object], error: type[Exception] | None
) -> None:
    """Every input the hot path could mistake for its own is refused (or converted) as the
    row-major, checked pool does, before anything is written."""
    for pool in pools(torch.float32, True):
        args = {"loc": torch.tensor([1, 2]), "k": torch.ones(2, HEADS, DIM)}
        args["v"] = args["k"]
        args.update(bad)
        before = [t.clone() for t in pool.get_kv_buffer(0)]
        if error is None:
            pool.set_kv_buffer(Layer(0), args["loc"], args["k"], args["v"])  # type: ignore[arg-type]
            assert pool.get_key_buffer(0)[1:3].eq(1).all()
            continue
        with pytest.raises(error):
            pool.set_kv_buffer(Layer(0), args["loc"], args["k"], args["v"])  # type: ignore[arg-type]
        after = pool.get_kv_buffer(0)
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_the_option_is_read_from_the_config_and_checked() -> None:
    config = PoolConfig(size=8, layer_num=1, head_num=2, head_dim=4, options={"head_major": True})
    pool, _ = create(config)
    assert pool.head_major and pool.get_key_buffer(0).transpose(0, 1).is_contiguous()
    assert not create(PoolConfig(size=8, layer_num=1))[0].head_major
    with pytest.raises(TypeError, match=r"options\['head_major'\] must be a bool"):
        create(PoolConfig(size=8, layer_num=1, options={"head_major": "yes"}))


def test_the_discovered_mha_pool_builds_head_major() -> None:
    """Through the registry (what the transformers integration asks for)."""
    config = PoolConfig(size=8, layer_num=1, head_num=2, head_dim=4, options={"head_major": True})
    pool, _ = discover().create("mha", config)
    assert pool.head_major


def test_head_major_needs_a_heads_by_dim_row() -> None:
    with pytest.raises(ValueError, match=r"head_major needs a \(heads, dim\) row shape"):
        LayerRows(1, 4, (8,), torch.float32, torch.device("cpu"), head_major=True)
