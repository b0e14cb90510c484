"""kvcache benchmarks: every figure is a ratio against a baseline measured in the same run.

Run: ``make bench`` (DESIGN.md shapes; several GB of RAM) or ``python benchmarks/bench.py
--quick`` (small shapes, seconds). Machines are noisy: variants are interleaved and the best of
``--repeat`` runs is kept for each, so a ratio compares like with like.

1. Offload/reload of every accepted pool: ``get_cpu_copy`` / ``load_cpu_copy`` GB/s next to a raw
   per-layer ``index_select`` into a freshly allocated host tensor / ``index_copy_`` back, over
   tensors of exactly the snapshot's shapes and dtypes. Target >= 0.85x.
2. Allocator: ``alloc(256)`` + ``free(256)`` cycles per second next to a naive torch free list
   that slices on alloc and ``torch.cat``s on free. Target >= 3x.
3. ``discover()`` next to bare pluggy ``load_setuptools_entrypoints`` of the same group.
   Target <= 1.3x.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from kvcache_core import KVSnapshot, PoolConfig, discover, host_empty

# ----------------------------------------------------------------------------------- helpers


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """Fastest wall time of ``repeat`` runs (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def interleaved(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best time of each function, running them in turn so drifting load hits all alike."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def walk_parts(snapshot: KVSnapshot, kind: str = "") -> Iterator[tuple[str, str, torch.Tensor]]:
    """Every part of a snapshot and its children, with its pool kind and its name."""
    for name, part in snapshot.parts.items():
        yield kind or snapshot.pool_kind, name, part
    for child in snapshot.children.values():
        if child is not None:
            yield from walk_parts(child, child.pool_kind)


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


def random_subset(slots: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    return slots[torch.randperm(slots.numel(), generator=gen)[:n]]


def token_case(pool: Any, allocator: Any, n: int, gen: torch.Generator) -> Case:
    """Offload ``n`` random allocated slots; reload into ``n`` other allocated slots."""
    slots = allocator.alloc(allocator.available_size() // allocator.page_size * allocator.page_size)
    chosen = random_subset(slots, 2 * n, gen)
    return Case(pool, chosen[:n], chosen[n:])


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


def swa_case(pool: Any, allocator: Any, n: int, gen: torch.Generator) -> Case:
    """Every token keeps its window slot (the window is as large as the full pool here)."""
    return token_case(pool, allocator, n, gen)


SETUPS: dict[str, Callable[[Any, Any, int, torch.Generator], Case]] = {
    "mha": token_case,
    "mla": token_case,
    "dsa": token_case,
    "hisparse": hisparse_case,
    "swa": swa_case,
    "mamba": mamba_case,
}


def configs(quick: bool) -> dict[str, PoolConfig]:
    """DESIGN.md section 7 shapes (or small ones), one config per built-in pool kind."""
    slots = 8192 if quick else 65536
    layers, heads, dim = (4, 8, 128) if quick else (16, 8, 128)
    common: dict[str, Any] = {"size": slots, "layer_num": layers, "dtype": torch.bfloat16}
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
    """The baseline: per-layer index_select into a fresh host tensor, index_copy_ back."""

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

    def gather_into_preallocated(self) -> None:
        """The same gather into outputs allocated once: the copy alone, without first-touch
        page faults of fresh host memory (a reference for how much allocation costs)."""
        if not hasattr(self, "_outs"):
            self._outs = [host_empty(p.shape, p.dtype, s.device) for s, _, p in self.items]
        for (source, idx, _), out in zip(self.items, self._outs, strict=True):
            for layer in range(source.shape[0]):
                torch.index_select(source[layer], 0, idx, out=out[layer])

    def gather(self) -> list[torch.Tensor]:
        outs = []
        for source, idx, part in self.items:
            out = host_empty(part.shape, part.dtype, source.device)
            for layer in range(source.shape[0]):
                torch.index_select(source[layer], 0, idx, out=out[layer])
            outs.append(out)
        return outs

    def scatter(self) -> None:
        for source, idx, part in self.items:
            for layer in range(source.shape[0]):
                source[layer].index_copy_(0, idx, part[layer])

    def scatter_written(self) -> None:
        """Scatter every byte the pool's reload must write (write-through copies included)."""
        self.scatter()
        for source, idx, part in self.extra_writes:
            for layer in range(source.shape[0]):
                source[layer].index_copy_(0, idx, part[layer])


def bench_offload(quick: bool, offload: int, repeat: int, only: set[str] | None) -> None:
    print(
        f"== offload/reload: {offload} slots, best of {repeat}, {torch.get_num_threads()} threads"
    )
    registry = discover()
    gen = torch.Generator().manual_seed(0)
    for name, config in configs(quick).items():
        if (only and name not in only) or name not in registry.accepted or name not in SETUPS:
            continue
        pool, allocator = registry.create(name, config)
        case = SETUPS[name](pool, allocator, offload, gen)
        snapshot = pool.get_cpu_copy(case.indices, mamba_indices=case.mamba_indices)
        raw = RawCopy(snapshot, case, gen)
        gb = snapshot.nbytes / 1e9
        variants: dict[str, Callable[[], object]] = {
            "get": lambda c=case: c.pool.get_cpu_copy(c.indices, mamba_indices=c.mamba_indices),
            "raw_get": raw.gather,
            "raw_get_prealloc": raw.gather_into_preallocated,
            "load": lambda c=case, s=snapshot: c.pool.load_cpu_copy(
                s, c.new_indices, mamba_indices=c.new_mamba_indices
            ),
            "raw_load": raw.scatter,
        }
        if raw.extra_writes:
            variants["raw_load_written"] = raw.scatter_written
        times = interleaved(variants, repeat)
        for op, base in (("get", "raw_get"), ("load", "raw_load")):
            ours, theirs = gb / times[op], gb / times[base]
            label = "get_cpu_copy " if op == "get" else "load_cpu_copy"
            extra = ""
            if op == "load" and raw.extra_writes:
                written = gb / times["raw_load_written"]
                extra = (
                    f"   (vs raw of all bytes it writes {written:5.2f}: "
                    f"ratio {ours / written:4.2f}x)"
                )
            if op == "get":
                extra = (
                    f"   (raw into a preallocated snapshot {gb / times['raw_get_prealloc']:5.2f})"
                )
            print(
                f"  {name:<9} {label} {ours:6.2f} GB/s   raw {theirs:6.2f} GB/s   "
                f"ratio {ours / theirs:4.2f}x   {snapshot.nbytes / 2**20:4.0f} MiB{extra}"
            )
        del pool, allocator, case, snapshot, raw


# ----------------------------------------------------------------------------- 2. allocator


class NaiveFreeList:
    """The baseline: a tensor of free slots, sliced on alloc, concatenated on every free."""

    def __init__(self, size: int) -> None:
        self.free_slots = torch.arange(1, size + 1, dtype=torch.int64)

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self.free_slots.numel():
            return None
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return out

    def free(self, indices: torch.Tensor) -> None:
        self.free_slots = torch.cat((self.free_slots, indices))


def bench_allocator(quick: bool, repeat: int) -> None:
    from kvcache_core import PagedSlotAllocator
    from kvcache_plugins.mha import MHATokenToKVPool

    size, cycles, chunk = 65536, (2000 if quick else 20000), 256
    pool = MHATokenToKVPool(8, 1, torch.float32, 1, 1, 1)
    print(f"== allocator: alloc({chunk}) + free({chunk}), {size} slots, {cycles} cycles")
    makers: dict[str, Callable[[], Any]] = {
        "kvcache": lambda: PagedSlotAllocator(size, 1, pool),
        "kvcache eager": lambda: PagedSlotAllocator(size, 1, pool, eager_checks=True),
        "naive cat": lambda: NaiveFreeList(size),
    }

    def run(make: Callable[[], Any]) -> Callable[[], None]:
        def cycle() -> None:
            allocator = make()
            for _ in range(cycles):
                allocator.free(allocator.alloc(chunk))

        return cycle

    times = interleaved({name: run(make) for name, make in makers.items()}, repeat)
    base = cycles / times["naive cat"]
    for name in makers:
        rate = cycles / times[name]
        print(f"  {name:<14} {rate / 1e3:8.1f}k cycles/s   ratio {rate / base:5.2f}x")


# ----------------------------------------------------------------------------- 3. discovery


_PRELUDE = "import time, torch, pluggy, kvcache_core\n"
_COLD = {
    "discover": "from kvcache_core import discover\nt = time.perf_counter()\ndiscover()\n",
    "pluggy": (
        "from kvcache_core import hookspecs as h\n"
        "t = time.perf_counter()\n"
        "pm = pluggy.PluginManager(h.PROJECT_NAME)\n"
        "pm.add_hookspecs(h)\n"
        "pm.load_setuptools_entrypoints(h.ENTRY_POINT_GROUP)\n"
        "pm.hook.kvcache_pool_specs()\n"
    ),
}


def cold(kind: str) -> float:
    """Seconds one fresh process spends in discovery (plugin imports included), after the
    interpreter, torch and kvcache itself are imported: what an engine pays at start-up."""
    code = _PRELUDE + _COLD[kind] + "print(time.perf_counter() - t)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def bench_discovery(repeat: int) -> None:
    """Cold: fresh processes, interleaved, best of ``repeat``. Both sides import the same
    plugin modules and call the same hook; discover() adds isolation and validation."""
    best = {"discover": float("inf"), "pluggy": float("inf")}
    for _ in range(max(repeat, 5)):
        for kind in best:
            best[kind] = min(best[kind], cold(kind))
    print("== discovery (fresh process, after import torch/kvcache)")
    ratio = best["discover"] / best["pluggy"]
    print(
        f"  discover() {best['discover'] * 1e3:7.2f} ms   "
        f"bare pluggy {best['pluggy'] * 1e3:7.2f} ms   ratio {ratio:4.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (seconds, < 1 GB)")
    parser.add_argument("--offload", type=int, default=None, help="slots to offload")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default="", help="comma list: pools, 'allocator', 'discovery'")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    only = {x for x in args.only.split(",") if x} or None
    offload = args.offload or (1024 if args.quick else 4096)
    bench_offload(args.quick, offload, args.repeat, only)
    if not only or "allocator" in only:
        bench_allocator(args.quick, args.repeat)
    if not only or "discovery" in only:
        bench_discovery(args.repeat)


if __name__ == "__main__":
    main()
