"""The snapshot wire format: bit-exact round trips for every built-in pool and dtype, and every
kind of bad blob refused with SnapshotMismatchError naming what is wrong."""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
import safetensors.torch
import torch
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcache_core import KVSnapshot, SnapshotMismatchError, discover
from kvcache_core.engine import (
    DemoSettings,
    Scheduler,
    TinyModel,
    choose_model,
    pool_config,
    single_thread,
)
from kvcache_core.engine.scheduler import make_requests
from kvcache_core.quantized import QuantizedLayerRows
from kvcache_core.snapshot_wire import FORMAT_VERSION, MAX_HEADER_BYTES
from kvcache_core.stores.battery import same_snapshot

FP8 = [
    d
    for d in (
        getattr(torch, n, None)
        for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    )
    if isinstance(d, torch.dtype)
]
DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
    *FP8,
]


def random_part(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random *bits* (NaN payloads, subnormals, every fp8 pattern), viewed as ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    raw = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


@st.composite
def snapshots(draw: st.DrawFn, depth: int = 0) -> KVSnapshot:
    parts = {}
    for i in range(draw(st.integers(0, 4))):
        shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
        parts[f"p{i}/{draw(st.text(max_size=3))}"] = random_part(
            shape, draw(st.sampled_from(DTYPES)), draw(st.integers(0, 2**31))
        )
    children = {}
    if depth < 2:
        for name in draw(
            st.lists(st.sampled_from(["window", "mamba", "x"]), unique=True, max_size=2)
        ):
            children[name] = draw(st.none() | snapshots(depth + 1))
    meta_values = st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.tuples(inner, inner)
            | st.dictionaries(st.text(max_size=3), inner, max_size=2)
        ),
        max_leaves=6,
    )
    return KVSnapshot(
        pool_kind=draw(st.sampled_from(["mha", "mla", "swa", "weird kind ✓"])),
        dtype=draw(st.sampled_from(DTYPES)),
        token_count=draw(st.integers(0, 10_000)),
        parts=parts,
        children=children,
        meta=draw(st.dictionaries(st.text(max_size=6), meta_values, max_size=3)),
    )


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_any_snapshot_round_trips_bit_exact(snap: KVSnapshot) -> None:
    blob = snap.to_bytes()
    back = KVSnapshot.from_bytes(blob)
    assert same_snapshot(snap, back) is None
    assert back.to_bytes() == blob  # deterministic: the same snapshot, the same bytes


@settings(max_examples=25, deadline=None)
@given(snapshots(), st.data())
def test_any_cut_or_flipped_byte_is_refused(snap: KVSnapshot, data: st.DataObject) -> None:
    blob = snap.to_bytes()
    cut = data.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(SnapshotMismatchError, match=r"truncated|not JSON|malformed|foreign"):
        KVSnapshot.from_bytes(blob[:cut])
    at = data.draw(st.integers(0, len(blob) - 1))
    bit = data.draw(st.integers(0, 7))
    flipped = bytearray(blob)
    flipped[at] ^= 1 << bit
    with pytest.raises(SnapshotMismatchError):
        KVSnapshot.from_bytes(flipped)


def _retracted_snapshots(name: str) -> list[KVSnapshot]:
    """Real snapshots of the built-in pool ``name``: the reference engine under memory
    pressure, capturing what ``get_cpu_copy`` returned at each retraction."""
    registry = discover()
    spec = registry.spec(name)
    kind, _ = choose_model(spec.capabilities)
    assert kind is not None
    # Small runs that still retract (HiSparse's device needs the larger budget).
    settings_ = DemoSettings(requests=8, budget=64) if name == "hisparse" else DemoSettings(6, 56)
    config = pool_config(kind, settings_.shape, settings_.budget, settings_.page_size, 8)
    pool, allocator = registry.create(name, config)
    stack = contextlib.ExitStack()
    stack.enter_context(single_thread())  # tiny tensors: threads only spin on busy cores
    captured: list[KVSnapshot] = []

    class Capturing(Scheduler):
        def _retract(self, req) -> None:  # type: ignore[no-untyped-def]
            super()._retract(req)
            assert req.snapshot is not None
            captured.append(req.snapshot)
            # Resume from the decoded copy: the tokens stay right only if it is exact.
            req.snapshot = KVSnapshot.from_bytes(req.snapshot.to_bytes())

    model = TinyModel(kind, settings_.shape, settings_.seed)
    with stack:
        requests = make_requests(settings_.requests, 0, settings_.shape.vocab)
        Capturing(model, pool, allocator).run(requests)
    return captured


@pytest.mark.parametrize("name", sorted(discover().names()))
def test_every_builtin_pool_snapshot_round_trips(name: str) -> None:
    snaps = _retracted_snapshots(name)
    assert snaps, f"{name}: the constrained run retracted nothing"
    for snap in snaps:
        back = KVSnapshot.from_bytes(snap.to_bytes())
        assert same_snapshot(snap, back) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, *FP8[:2]])
def test_a_pool_reloads_a_decoded_snapshot_bit_exact(dtype: torch.dtype) -> None:
    """Through a real pool: random bits in, snapshot -> bytes -> snapshot -> another pool's
    slots, and the second pool's snapshot equals the first bit for bit (fp8 included)."""
    from kvcache_core import PoolConfig

    registry = discover()
    config = PoolConfig(size=64, layer_num=2, head_num=2, head_dim=8, page_size=4, dtype=dtype)
    (_, alloc_a), (_, alloc_b) = (
        registry.create("mha", config),
        registry.create("mha", config),
    )
    slots = torch.tensor([5, 9, 10, 33])
    blank = alloc_a.get_cpu_copy(slots)
    seeded = KVSnapshot(
        blank.pool_kind,
        blank.dtype,
        blank.token_count,
        {
            n: random_part(tuple(t.shape), t.dtype, i)
            for i, (n, t) in enumerate(blank.parts.items())
        },
        meta=blank.meta,
    )
    alloc_a.load_cpu_copy(seeded, slots)
    first = alloc_a.get_cpu_copy(slots)
    assert same_snapshot(first, seeded) is None
    alloc_b.load_cpu_copy(KVSnapshot.from_bytes(first.to_bytes()), torch.tensor([1, 2, 3, 4]))
    assert same_snapshot(alloc_b.get_cpu_copy(torch.tensor([1, 2, 3, 4])), first) is None


@pytest.mark.parametrize("quant", [torch.int8, *FP8[:1]])
def test_quantised_parts_round_trip(quant: torch.dtype) -> None:
    rows = QuantizedLayerRows(
        2, 16, (2, 8), dtype=torch.bfloat16, device=torch.device("cpu"), quant_dtype=quant, block=4
    )
    for layer in range(2):
        rows.write(layer, torch.arange(16), *rows.quantize(torch.randn(16, 2, 8).bfloat16()))
    values, scales = rows.gather(torch.tensor([3, 1, 7]))
    snap = KVSnapshot("int8-mha", torch.bfloat16, 3, {"kv": values, "kv_scale": scales})
    back = KVSnapshot.from_bytes(snap.to_bytes())
    assert same_snapshot(snap, back) is None


def test_decoded_parts_own_their_memory() -> None:
    """A decoded part is never a view of the blob: an in-place write to it changes neither an
    immutable ``bytes`` object nor the value a ``memory:`` store holds, and a caller reusing
    its bytearray cannot change a checked snapshot."""
    from kvcache_core.stores import get_snapshot, open_store, put_snapshot

    snap = KVSnapshot(
        "mha", torch.float32, 4, {"k": torch.randn(2, 4, 8), "v": torch.randn(2, 4, 8)}
    )
    blob = snap.to_bytes()
    kept = bytes(bytearray(blob))  # an independent copy to compare with
    back = KVSnapshot.from_bytes(blob)
    start = id(blob)  # CPython: a bytes object's data lives inside the object
    for t in back.parts.values():
        assert not start <= t.data_ptr() < start + 64 + len(blob)
        t.add_(1.0)
    assert blob == kept
    store = open_store("memory:owned-parts")
    put_snapshot(store, "s", snap)
    first = get_snapshot(store, "s")
    assert first is not None
    first.parts["k"].zero_()
    assert same_snapshot(get_snapshot(store, "s"), snap) is None
    mutable = bytearray(blob)
    owned = KVSnapshot.from_bytes(mutable)
    mutable[-1] ^= 0xFF  # a caller reusing its buffer cannot change a checked snapshot
    assert same_snapshot(owned, snap) is None


def test_the_blob_is_a_safetensors_file() -> None:
    snap = KVSnapshot(
        "mha",
        torch.bfloat16,
        3,
        {"k": torch.randn(3, 4).bfloat16()},
        children={"mamba": KVSnapshot("state", torch.float32, 1, {"s": torch.ones(2)})},
    )
    tensors = safetensors.torch.load(snap.to_bytes())
    assert sorted(str(t.dtype) for t in tensors.values()) == ["torch.bfloat16", "torch.float32"]


def _rewrite(blob: bytes, edit) -> bytes:  # type: ignore[no-untyped-def]
    """Re-emit ``blob`` with its kvcache document edited and the checksum made valid again,
    so a test reaches the checks that come after the checksum."""
    (n,) = struct.unpack_from("<Q", blob)
    header = json.loads(blob[8 : 8 + n])
    doc = json.loads(header["__metadata__"]["kvcache"])
    edit(doc, header)
    meta_doc = json.dumps(doc, separators=(",", ":"))
    table = {k: v for k, v in header.items() if k != "__metadata__"}
    digest = xxhash.xxh3_64((meta_doc + json.dumps(table, separators=(",", ":"))).encode())
    digest.update(blob[8 + n :])
    checksum = f"xxh3_64:{digest.hexdigest()}"
    header["__metadata__"] = {"kvcache": meta_doc, "kvcache.checksum": checksum}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 16)
    return struct.pack("<Q", len(text)) + text + blob[8 + n :]


def _foreign(metadata: dict[str, str] | None) -> bytes:
    """A safetensors file as any other tool writes one (two float32 ones)."""
    header: dict[str, object] = {"k": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + bytes(torch.ones(2).view(torch.uint8).tolist())


SNAP = KVSnapshot("mha", torch.float32, 2, {"k": torch.ones(2, 3)}, meta={"layer_num": 1})


@pytest.mark.parametrize(
    ("blob", "words"),
    [
        (b"", "truncated: 0 bytes"),
        (b"\x00" * 7, "truncated: 7 bytes"),
        (struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}", "exceeds"),
        (struct.pack("<Q", 100) + b"{}", "header needs 108 bytes"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "not JSON"),
        (_foreign(None), "without kvcache metadata"),
        (_foreign({"kvcache": "{}"}), "no format version"),
        (
            _rewrite(SNAP.to_bytes(), lambda d, h: d.update(format=FORMAT_VERSION + 1)),
            "upgrade kvcache",
        ),
        (_rewrite(SNAP.to_bytes(), lambda d, h: d.update(contract=99)), "contract 99"),
        (
            _rewrite(SNAP.to_bytes(), lambda d, h: d["snapshot"].update(dtype="float99")),
            "unknown dtype",
        ),
        (
            _rewrite(
                SNAP.to_bytes(), lambda d, h: d["snapshot"]["parts"][0].__setitem__(3, [3, 2])
            ),
            "tensor table",
        ),
        (
            _rewrite(
                SNAP.to_bytes(),
                lambda d, h: d["snapshot"]["parts"].append(["v", "t0", "float32", [2, 3]]),
            ),
            "used twice",
        ),
        (
            _rewrite(SNAP.to_bytes(), lambda d, h: d["snapshot"]["parts"].clear()),
            "belong to no part",
        ),
        (_rewrite(SNAP.to_bytes(), lambda d, h: d["snapshot"].update(tokens=-1)), "token count"),
        (
            _rewrite(SNAP.to_bytes(), lambda d, h: d["snapshot"]["meta"].update(x={"pickle": 1})),
            "not a wire-format value",
        ),
        (
            _rewrite(SNAP.to_bytes(), lambda d, h: h["t0"].update(data_offsets=[4, 28])),
            "starts at byte 4",
        ),
        (SNAP.to_bytes() + b"tail", "oversized: 4 bytes after the last tensor"),
        (
            SNAP.to_bytes().replace(b"xxh3_64:", b"xxh3_64:0", 1),
            "header is not JSON|malformed|foreign",
        ),
    ],
)
def test_bad_blobs_are_refused_with_the_reason(blob: bytes, words: str) -> None:
    with pytest.raises(SnapshotMismatchError, match=words):
        KVSnapshot.from_bytes(blob)


def test_deep_nesting_and_size_limits() -> None:
    deep = SNAP
    for _ in range(9):
        deep = KVSnapshot("mha", torch.float32, 0, {}, children={"c": deep})
    with pytest.raises(ValueError, match="deeper than 8"):
        deep.to_bytes()
    with pytest.raises(SnapshotMismatchError, match=r"oversized: .* more than the 10 allowed"):
        KVSnapshot.from_bytes(SNAP.to_bytes(), max_bytes=10)
    with pytest.raises(SnapshotMismatchError, match="expected the bytes of a snapshot, got str"):
        KVSnapshot.from_bytes("text")  # type: ignore[arg-type]


def test_meta_that_cannot_travel_is_refused_by_name() -> None:
    snap = KVSnapshot("mha", torch.float32, 0, {}, meta={"fn": print})
    with pytest.raises(TypeError, match="meta 'fn' holds a builtin_function_or_method"):
        snap.to_bytes()


def test_a_corrupted_blob_never_reaches_the_pool() -> None:
    """The whole path an engine takes: a bad blob raises before load_cpu_copy is called, so the
    pool's buffers are untouched."""
    from kvcache_core import PoolConfig

    _, alloc = discover().create(
        "mha",
        PoolConfig(size=32, layer_num=1, head_num=1, head_dim=4, page_size=4, dtype=torch.float32),
    )
    snap = alloc.get_cpu_copy(torch.tensor([1, 2]))
    blob = bytearray(
        KVSnapshot(
            snap.pool_kind,
            snap.dtype,
            2,
            {n: torch.full_like(t, 7.0) for n, t in snap.parts.items()},
            meta=snap.meta,
        ).to_bytes()
    )
    blob[-1] ^= 1
    before = {n: t.clone() for n, t in alloc.get_cpu_copy(torch.tensor([1, 2])).parts.items()}
    with pytest.raises(SnapshotMismatchError, match="checksum mismatch"):
        alloc.load_cpu_copy(KVSnapshot.from_bytes(blob), torch.tensor([1, 2]))
    after = alloc.get_cpu_copy(torch.tensor([1, 2]))
    assert all(torch.equal(before[n], after.parts[n]) for n in before)


def test_every_single_byte_flip_is_refused() -> None:
    """Exhaustive on a small blob: header, tensor table, padding and data alike."""
    blob = KVSnapshot(
        "mha",
        torch.bfloat16,
        3,
        {"k": torch.randn(2, 3, 4).bfloat16(), "q": torch.ones(3, 2)},
        meta={"ids": (1, 2)},
    ).to_bytes()
    for at in range(len(blob)):
        flipped = bytearray(blob)
        flipped[at] ^= 0x01
        with pytest.raises(SnapshotMismatchError):
            KVSnapshot.from_bytes(flipped)


def test_a_corrupted_escape_in_the_header_is_refused_as_a_mismatch() -> None:
    """A flipped byte can turn the header's JSON into an escape of a lone surrogate: valid JSON,
    but text that was never written. It is a mismatch, not a UnicodeEncodeError."""
    blob = SNAP.to_bytes()
    (n,) = struct.unpack_from("<Q", blob)
    text = blob[8 : 8 + n].rstrip(b" ")
    assert b"mha" in text
    text = text.replace(b"mha", b"m\\udab2ha", 1)
    text += b" " * (-(8 + len(text)) % 16)
    bad = struct.pack("<Q", len(text)) + text + blob[8 + n :]
    with pytest.raises(SnapshotMismatchError, match="not valid UTF-8"):
        KVSnapshot.from_bytes(bad)
