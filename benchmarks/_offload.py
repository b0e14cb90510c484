"""Section 1 of ``make bench``: offload and reload of every accepted pool."""

from __future__ import annotations

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
