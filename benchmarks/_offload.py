"""Section 1 of ``make bench``: offload and reload of every accepted pool (issue 9).

Four figures per pool, each a ratio to a baseline measured in the same run, interleaved, as
the median of ``repeat`` rounds:

* ``get_cpu_copy``: the pool's offload of random slots against the same gather (per-layer
  ``index_select``) into outputs allocated beforehand, from buffers allocated with
  ``torch.zeros`` (target >= 0.9x: the snapshot's memory must cost next to nothing).
* ``load_cpu_copy``: the pool's reload against a plain per-layer ``index_copy_`` of the same
  bytes into ``torch.zeros`` buffers, as the pools allocated them before (target >= 1.25x).
  HiSparse's reload writes the latent twice (write-through: its device copy and the logical
  store), so its baseline writes those bytes too.
* ``... pN``: a pool with ``page_size`` N offloading and reloading whole pages, against one
  contiguous ``copy_`` (memcpy) of the same bytes (target >= 0.8x).
* ``first get_cpu_copy``: an offload with no cached snapshot block (fresh 4 KiB pages, faulted
  in during the copy), against the old way: a fresh ``torch.empty`` and the per-layer gather
  (target >= 1.0x: the block cache must not make the first call slower). Both sides pay the
  same page faults, so this is parity by design and reads 0.95-1.1x with noise.

Every pool's buffers are written once before timing, as serving would have (an untouched
anonymous mapping reads as one shared zero page, which would flatter the pool).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from _report import figure, interleaved, median_of

from kvcache_core import KVSnapshot, LayerRows, PoolConfig, QuantizedLayerRows, discover
from kvcache_core.hostmem import release_host_cache

# ----------------------------------------------------------------------------------- helpers


def walk_parts(snapshot: KVSnapshot, kind: str = "") -> Iterator[tuple[str, str, torch.Tensor]]:
    """Every part of a snapshot and its children, with its pool kind and its name."""
    for name, part in snapshot.parts.items():
        yield kind or snapshot.pool_kind, name, part
    for child in snapshot.children.values():
        if child is not None:
            yield from walk_parts(child, child.pool_kind)


def touch_buffers(obj: object, seen: set[int] | None = None, depth: int = 4) -> int:
    """Write (zero) the row buffers of a pool, recursing into its sub-pools, as a serving
    engine would have written them; returns the bytes written. Only ``LayerRows`` and
    ``QuantizedLayerRows`` buffers: tables and free lists are left alone."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth < 0:
        return 0
    seen.add(id(obj))
    if isinstance(obj, (LayerRows, QuantizedLayerRows)):
        tensors = [obj.data] + ([obj.scales] if isinstance(obj, QuantizedLayerRows) else [])
        for t in tensors:
            t.zero_()
        return sum(t.numel() * t.element_size() for t in tensors)
    if isinstance(obj, (list, tuple)):
        return sum(touch_buffers(x, seen, depth - 1) for x in obj)
    module = type(obj).__module__ or ""
    if not module.startswith(("kvcache_core", "kvcache_plugins")) or not hasattr(obj, "__dict__"):
        return 0
    return sum(touch_buffers(x, seen, depth - 1) for x in vars(obj).values())


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on Linux
        return "n/a"


def rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:6.2f} GB/s"


# ------------------------------------------------------------------------------- 1. offload


@dataclass
class Case:
    """One pool set up for offloading: what to offload and where to reload it."""

    pool: Any
    indices: torch.Tensor
    new_indices: torch.Tensor
    mamba_indices: torch.Tensor | None = None
    new_mamba_indices: torch.Tensor | None = None
    #: rows of the buffers request-indexed state lives in (for the baseline's source tensors)
    request_rows: int = 0
    #: parts that reload must write in more than one place (a write-through copy), and how many
    written_copies: dict[str, int] = field(default_factory=dict)

    def get(self) -> KVSnapshot:
        return self.pool.get_cpu_copy(self.indices, mamba_indices=self.mamba_indices)  # type: ignore[no-any-return]

    def load(self, snapshot: KVSnapshot) -> None:
        self.pool.load_cpu_copy(snapshot, self.new_indices, mamba_indices=self.new_mamba_indices)


def random_subset(slots: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    return slots[torch.randperm(slots.numel(), generator=gen)[:n]]


def token_case(pool: Any, allocator: Any, n: int, gen: torch.Generator) -> Case:
    """Offload ``n`` allocated slots; reload into ``n`` other allocated slots.

    Page size 1: random slots. Page size P > 1: ``n / P`` random whole pages (the slots of
    each page in order), as an engine offloads a paged request.
    """
    page = allocator.page_size
    slots = allocator.alloc(allocator.available_size() // page * page)
    if page == 1:
        chosen = random_subset(slots, 2 * n, gen)
        return Case(pool, chosen[:n], chosen[n:])
    pages = torch.unique(slots // page)  # a paged allocator hands out whole pages
    chosen = random_subset(pages, 2 * (n // page), gen)
    rows = (chosen.unsqueeze(1) * page + torch.arange(page)).reshape(-1)
    half = rows.numel() // 2
    return Case(pool, rows[:half], rows[half:])


def mamba_case(pool: Any, allocator: Any, n: int, gen: torch.Generator) -> Case:
    """Token slots as for any pool, plus the recurrent state of a few requests."""
    case = token_case(pool, allocator, n, gen)
    requests = allocator.mamba_allocator.alloc(allocator.mamba_allocator.available_size())
    chosen = random_subset(requests, 32, gen)
    case.mamba_indices, case.new_mamba_indices = chosen[:16], chosen[16:]
    case.request_rows = allocator.mamba_allocator.size + 1
    return case


def hisparse_case(pool: Any, allocator: Any, n: int, gen: torch.Generator) -> Case:
    """Resident tokens: reload writes the latent to the device copy and to the logical store
    (write-through), so the bytes it must write are the latent twice plus the indexer."""
    case = token_case(pool, allocator, n, gen)
    case.written_copies = {"latent": 2}
    return case


SETUPS: dict[str, Callable[[Any, Any, int, torch.Generator], Case]] = {
    "mha": token_case,
    "mla": token_case,
    "dsa": token_case,
    "hisparse": hisparse_case,
    "swa": token_case,  # every token keeps its window slot (the window is the full pool here)
    "mamba": mamba_case,
}


def configs(quick: bool, page_size: int = 1) -> dict[str, PoolConfig]:
    """The shapes of docs/architecture.md, "Performance notes" (or small ones), one config
    per built-in pool kind."""
    slots = 8192 if quick else 65536
    layers, heads, dim = (4, 8, 128) if quick else (16, 8, 128)
    common: dict[str, Any] = {
        "size": slots,
        "layer_num": layers,
        "dtype": torch.bfloat16,
        "page_size": page_size,
    }
    latent: dict[str, Any] = {"kv_lora_rank": 512, "qk_rope_head_dim": 64}
    half = tuple(range(0, layers, 2))
    return {
        "mha": PoolConfig(head_num=heads, head_dim=dim, **common),
        "mla": PoolConfig(**latent, **common),
        "dsa": PoolConfig(index_head_dim=128, **latent, **common),
        "hisparse": PoolConfig(index_head_dim=128, hisparse_ratio=2, **latent, **common),
        "swa": PoolConfig(head_num=heads, head_dim=dim, swa_layer_ids=half, **common),
        "mamba": PoolConfig(
            head_num=heads,
            head_dim=dim,
            mamba_layer_ids=half,
            mamba_size=64,
            conv_state_shapes=((dim * 4, 3),),
            temporal_state_shape=(heads, dim, 16),
            **common,
        ),
    }


class RawCopy:
    """The baselines: the same per-layer copies on buffers allocated as before (``torch.zeros``
    sources, ``torch.empty`` snapshots), part for part."""

    def __init__(self, snapshot: KVSnapshot, case: Case, gen: torch.Generator) -> None:
        self.items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.extra_writes: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        token_rows = case.pool.size + case.pool.page_size
        for kind, name, part in walk_parts(snapshot):
            if part.dim() < 2:
                continue  # masks and the like: a few bytes
            layers, n = part.shape[0], part.shape[1]
            rows = case.request_rows if kind == "mamba-state" else token_rows
            for copy in range(case.written_copies.get(name, 1)):
                source = torch.zeros((layers, max(rows, n), *part.shape[2:]), dtype=part.dtype)
                idx = torch.randperm(source.shape[1], generator=gen)[:n]
                (self.items if copy == 0 else self.extra_writes).append((source, idx, part))
        self._outs = [torch.empty(p.shape, dtype=p.dtype) for _, _, p in self.items]

    @property
    def written_bytes(self) -> int:
        """Bytes a reload writes: every part, write-through copies included."""
        return sum(p.numel() * p.element_size() for _, _, p in self.items + self.extra_writes)

    def gather_into_preallocated(self) -> None:
        """The gather into outputs allocated once: the copy alone, without first-touch page
        faults of fresh host memory."""
        for (source, idx, _), out in zip(self.items, self._outs, strict=True):
            for layer in range(source.shape[0]):
                torch.index_select(source[layer], 0, idx, out=out[layer])

    def gather_fresh(self) -> list[torch.Tensor]:
        """The old offload: a fresh ``torch.empty`` per part, then the per-layer gather."""
        outs = []
        for source, idx, part in self.items:
            out = torch.empty(part.shape, dtype=part.dtype)
            for layer in range(source.shape[0]):
                torch.index_select(source[layer], 0, idx, out=out[layer])
            outs.append(out)
        return outs

    def scatter_written(self) -> None:
        """Per-layer ``index_copy_`` of every byte the pool's reload must write."""
        for source, idx, part in self.items + self.extra_writes:
            for layer in range(source.shape[0]):
                source[layer].index_copy_(0, idx, part[layer])


class Memcpy:
    """One contiguous ``copy_`` of ``nbytes`` (the practical limit of any copy)."""

    def __init__(self, nbytes: int) -> None:
        self.src = torch.ones(nbytes, dtype=torch.uint8)
        self.dst = torch.zeros(nbytes, dtype=torch.uint8)

    def __call__(self) -> None:
        self.dst.copy_(self.src)


def first_call_times(case: Case, raw: RawCopy, repeat: int) -> tuple[float, float]:
    """Median of an offload with no cached block (fresh memory) and of the old way. The order
    alternates every round (whichever runs second inherits the page state the first left), and
    the snapshots are dropped at once so the next round starts empty again."""
    times: dict[str, list[float]] = {"ours": [], "old": []}

    def ours() -> None:
        release_host_cache()
        start = time.perf_counter()
        snapshot = case.get()
        times["ours"].append(time.perf_counter() - start)
        del snapshot
        release_host_cache()

    def old() -> None:
        start = time.perf_counter()
        outs = raw.gather_fresh()
        times["old"].append(time.perf_counter() - start)
        del outs

    for round_ in range(repeat):
        for side in (ours, old) if round_ % 2 == 0 else (old, ours):
            side()
    medians = median_of(times)
    return medians["ours"], medians["old"]


def build(name: str, config: PoolConfig, n: int, gen: torch.Generator) -> Case:
    registry = discover()
    pool, allocator = registry.create(name, config)
    touch_buffers(pool)
    return SETUPS[name](pool, allocator, n, gen)


def bench_random(name: str, config: PoolConfig, n: int, repeat: int, gen: torch.Generator) -> None:
    case = build(name, config, n, gen)
    snapshot = case.get()
    raw = RawCopy(snapshot, case, gen)
    size = snapshot.nbytes
    times = median_of(
        interleaved(
            {
                "get": case.get,
                "raw_get_prealloc": raw.gather_into_preallocated,
                "load": lambda: case.load(snapshot),
                "raw_load": raw.scatter_written,
            },
            repeat,
        )
    )
    mib = f"{size / 2**20:.0f} MiB"
    figure(
        f"{name:<9} get_cpu_copy",
        rate(size, times["get"]),
        f"index_select, prealloc {rate(size, times['raw_get_prealloc']).strip()}",
        times["raw_get_prealloc"] / times["get"],
        0.9,
        note=mib,
    )
    written = raw.written_bytes
    note = mib
    if raw.extra_writes:
        note += (
            f"; write-through: reload writes the latent twice, {written / 2**20:.0f} MiB, "
            "and so does the baseline"
        )
    figure(
        f"{name:<9} load_cpu_copy",
        rate(written, times["load"]),
        f"index_copy_, torch.zeros {rate(written, times['raw_load']).strip()}",
        times["raw_load"] / times["load"],
        1.25,
        note=note,
    )
    ours, old = first_call_times(case, raw, repeat)
    figure(
        f"{name:<9} first get_cpu_copy",
        rate(size, ours),
        f"torch.empty+index_select {rate(size, old).strip()}",
        old / ours,
        1.0,
        note="no cached block: fresh memory on both sides",
    )


def bench_paged(
    name: str, config: PoolConfig, n: int, repeat: int, gen: torch.Generator, page: int
) -> None:
    case = build(name, config, n, gen)
    snapshot = case.get()
    size = snapshot.nbytes
    written = sum(
        p.numel() * p.element_size() * case.written_copies.get(name, 1)
        for _, name, p in walk_parts(snapshot)
    )
    through = bool(case.written_copies)
    get_copy, load_copy = Memcpy(size), Memcpy(written)
    times = median_of(
        interleaved(
            {
                "get": case.get,
                "memcpy_get": get_copy,
                "load": lambda: case.load(snapshot),
                "memcpy_load": load_copy,
            },
            repeat,
        )
    )
    figure(
        f"{name:<9} get_cpu_copy p{page}",
        rate(size, times["get"]),
        f"memcpy {rate(size, times['memcpy_get']).strip()}",
        times["memcpy_get"] / times["get"],
        0.8,
        note=f"{n // page} whole pages of {page}",
    )
    note = f"{n // page} whole pages of {page}"
    if through:
        note += f"; write-through: memcpy of the {written / 2**20:.0f} MiB it writes"
    figure(
        f"{name:<9} load_cpu_copy p{page}",
        rate(written, times["load"]),
        f"memcpy {rate(written, times['memcpy_load']).strip()}",
        times["memcpy_load"] / times["load"],
        0.8,
        note=note,
    )


def bench_offload(
    quick: bool, offload: int, repeat: int, only: set[str] | None, pages: tuple[int, ...] = (64,)
) -> None:
    print(
        f"== offload/reload: {offload} slots, median of {repeat} interleaved, "
        f"{torch.get_num_threads()} threads, load average {load_average()}"
    )
    accepted = discover().accepted
    gen = torch.Generator().manual_seed(0)
    chosen = [
        name
        for name in configs(quick)
        if (not only or name in only) and name in accepted and name in SETUPS
    ]
    for name in chosen:
        bench_random(name, configs(quick)[name], offload, repeat, gen)
        release_host_cache()
    for page in pages:
        for name in chosen:
            bench_paged(name, configs(quick, page)[name], offload, repeat, gen, page)
            release_host_cache()
    print(f"   load average after the offload section: {load_average()}")
