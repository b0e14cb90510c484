"""Run a pool twice (ample memory, then a budget that forces retractions) and compare tokens.

The model is chosen from the pool's *declared capabilities*, never from its name, so a
third-party pool installed by entry point runs like the built-ins when its capabilities fit a
model (offload + paged, and nothing else, is an MHA model). A pool that raises is reported as
an error for that pool only; the other pools still run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch

from kvcache_core import (
    Capability,
    HiSparsePool,
    IndexerKeyPool,
    KVPool,
    MambaStatePool,
    MLAPool,
    OffloadablePool,
    PoolConfig,
    PoolSpec,
    Registry,
    SlidingWindowPool,
    TokenAllocator,
)

from ..contracts.spec import declared_protocols
from .model import ModelShape, TinyModel, layer_types
from .reference import REFERENCE_KINDS, reference_outputs
from .scheduler import Request, Scheduler, Unsupported, make_requests

__all__ = [
    "DemoSettings",
    "PoolReport",
    "RunStats",
    "choose_model",
    "pool_config",
    "run_demo",
    "run_pool",
    "single_thread",
    "smallest_budget",
]

#: HiSparse: logical slots per device slot (the budget counts logical slots).
HISPARSE_RATIO = 2

#: Which Protocols a model kind needs from the pool it runs on.
_NEEDS: dict[str, tuple[type, ...]] = {
    "mha": (OffloadablePool,),
    "mla": (OffloadablePool, MLAPool),
    "dsa": (OffloadablePool, MLAPool, IndexerKeyPool),
    "hisparse": (OffloadablePool, MLAPool, IndexerKeyPool, HiSparsePool),
    "swa": (OffloadablePool, SlidingWindowPool),
    "mamba": (OffloadablePool, MambaStatePool),
}


@dataclass(frozen=True)
class DemoSettings:
    """What ``kvcache demo`` runs: defaults force several retractions on every built-in pool."""

    requests: int = 12
    budget: int = 96  # token slots in the constrained run
    seed: int = 0
    page_size: int = 4
    max_running: int = 8
    shape: ModelShape = field(default_factory=ModelShape)


@dataclass
class RunStats:
    """One run of one pool: what was served and what retraction cost."""

    budget: int
    requests: int
    tokens_generated: int
    retractions: int
    resumes: int
    evictions: int
    bytes_offloaded: int
    offload_gb_per_s: float | None
    reload_gb_per_s: float | None
    peak_slots_in_use: int
    steps: int
    seconds: float


@dataclass
class PoolReport:
    """The demo's verdict for one pool: ``identical``, ``differ``, ``error`` or ``skipped``."""

    pool: str
    status: str
    model: str | None = None
    page_size: int | None = None
    reason: str | None = None
    note: str | None = None
    ample: RunStats | None = None
    constrained: RunStats | None = None
    identical: bool | None = None
    differing_requests: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def choose_model(capabilities: frozenset[Capability]) -> tuple[str | None, str]:
    """The model kind that fits ``capabilities``, or None and why none does."""
    caps = capabilities
    if Capability.OFFLOAD not in caps:
        return None, "no 'offload' capability: the engine could not retract its requests"
    if Capability.HISPARSE in caps:
        if {Capability.MLA, Capability.INDEXER} <= caps:
            return "hisparse", "hisparse + mla + indexer"
        return None, "'hisparse' without 'mla' and 'indexer': no model reads such a pool"
    if Capability.MLA in caps:
        return ("dsa", "mla + indexer") if Capability.INDEXER in caps else ("mla", "mla")
    if Capability.INDEXER in caps:
        return None, "'indexer' without 'mla': no model reads such a pool"
    if Capability.SLIDING_WINDOW in caps:
        return "swa", "sliding-window"
    if Capability.MAMBA_STATE in caps:
        return "mamba", "mamba-state"
    return "mha", "offload" + (" + paged" if Capability.PAGED in caps else "")


def _round_up(value: int, page: int) -> int:
    return -(-value // page) * page


def pool_config(
    kind: str, shape: ModelShape, budget: int, page: int, max_running: int
) -> PoolConfig:
    """A ``PoolConfig`` for a model kind with ``budget`` token slots (logical on HiSparse)."""
    types = layer_types(kind, shape.layers)
    size = _round_up(budget, page)
    common: dict[str, Any] = {
        "layer_num": shape.layers,
        "head_num": shape.heads,
        "head_dim": shape.head_dim,
        "page_size": page,
        "dtype": torch.float32,
    }
    if kind in ("mla", "dsa", "hisparse"):
        common.update(
            kv_lora_rank=shape.kv_lora_rank,
            qk_rope_head_dim=shape.rope_dim,
            index_head_dim=shape.index_dim,
        )
    if kind == "hisparse":
        size = _round_up(-(-budget // HISPARSE_RATIO), page)
        common["hisparse_ratio"] = HISPARSE_RATIO
    if kind == "swa":
        common["swa_layer_ids"] = tuple(i for i, t in enumerate(types) if t == "window")
        # As many window slots as full ones: alloc_extend (a prefill, and a resume before the
        # snapshot's mask trims it) needs a window slot per token, so a smaller window side
        # would be the binding limit and hide the full side's retractions.
        common["swa_size"] = size
    if kind == "mamba":
        common.update(
            mamba_layer_ids=tuple(i for i, t in enumerate(types) if t == "mamba"),
            mamba_size=max_running,
            conv_state_shapes=((shape.conv_width - 1, shape.hidden),),
            temporal_state_shape=(shape.hidden,),
            mamba_dtype=torch.float32,
        )
    return PoolConfig(size=size, **common)


def _ample_budget(requests: Sequence[Request], page: int) -> int:
    """Enough slots for every request at full length at once: no retraction can happen."""
    return sum(_round_up(len(r.prompt) + r.max_new, page) + page for r in requests)


def smallest_budget(settings: DemoSettings) -> int:
    """The least ``budget`` that holds the longest request alone (with a spare page)."""
    page = settings.page_size
    requests = make_requests(settings.requests, settings.seed, settings.shape.vocab)
    return max(_round_up(len(r.prompt) + r.max_new, page) + page for r in requests)


def _gbps(nbytes: int, seconds: float) -> float | None:
    return round(nbytes / seconds / 1e9, 3) if nbytes and seconds > 0 else None


def _run_once(
    create: Callable[[PoolConfig], tuple[Any, Any]],
    kind: str,
    settings: DemoSettings,
    budget: int,
    page: int,
    progress: Callable[[Scheduler], None] | None,
    capabilities: frozenset[Capability] = frozenset(),
) -> tuple[RunStats, dict[int, list[int]]]:
    began = time.perf_counter()
    config = pool_config(kind, settings.shape, budget, page, settings.max_running)
    pool, allocator = create(config)
    missing = [p.__name__ for p in _NEEDS[kind] if not isinstance(pool, p)]
    if missing or not isinstance(allocator, TokenAllocator):
        what = ", ".join(missing) if missing else "TokenAllocator (allocator)"
        raise TypeError(f"the factory's objects do not satisfy {what}")
    # Every Protocol the spec's capabilities promise, on the object of its role: a declared
    # capability the engine would otherwise skip (a window never released, pages allocated
    # one token at a time) is an error here, not a silent fallback.
    objects = {"pool": pool, "allocator": allocator}
    broken = [
        f"{proto.__name__} ({role})"
        for role, protos in declared_protocols(capabilities).items()
        for proto in protos
        if not isinstance(objects[role], proto)
    ]
    if broken:
        raise TypeError(
            f"the factory's objects do not satisfy what the spec declares: {', '.join(broken)}"
        )
    assert isinstance(pool, KVPool)
    model = TinyModel(kind, settings.shape, settings.seed)
    requests = make_requests(settings.requests, settings.seed, settings.shape.vocab)
    scheduler = Scheduler(
        model, pool, allocator, max_running=settings.max_running, progress=progress
    )
    outputs = scheduler.run(requests)
    s = scheduler.stats
    stats = RunStats(
        budget=budget,
        requests=len(outputs),
        tokens_generated=s.tokens,
        retractions=s.retractions,
        resumes=s.resumes,
        evictions=s.evictions,
        bytes_offloaded=s.bytes_offloaded,
        offload_gb_per_s=_gbps(s.bytes_offloaded, s.offload_seconds),
        reload_gb_per_s=_gbps(s.bytes_offloaded, s.reload_seconds),
        peak_slots_in_use=s.peak_slots,
        steps=s.steps,
        seconds=round(time.perf_counter() - began, 3),
    )
    return stats, outputs


def run_pool(
    name: str,
    spec: PoolSpec,
    settings: DemoSettings,
    progress: Callable[[str, str, Scheduler], None] | None = None,
    create: Callable[[PoolConfig], tuple[Any, Any]] | None = None,
) -> PoolReport:
    """Run ``spec`` with ample memory, then with ``settings.budget``; compare the tokens with
    each other and, for the model kinds in ``reference.REFERENCE_KINDS``, with the same model
    over a plain reference store (which catches a pool that corrupts both runs alike).

    ``create`` builds the pool and allocator (default ``spec.factory``; `run_demo` passes
    ``registry.create``, which also checks the factory returned a pool).
    """
    kind, why = choose_model(spec.capabilities)
    if kind is None:
        return PoolReport(name, "skipped", reason=why)
    with single_thread():
        return _run_pool(name, spec, kind, settings, progress, create or spec.factory)


def _run_pool(
    name: str,
    spec: PoolSpec,
    kind: str,
    settings: DemoSettings,
    progress: Callable[[str, str, Scheduler], None] | None,
    create: Callable[[PoolConfig], tuple[Any, Any]],
) -> PoolReport:
    # Without the paged capability the allocator only has alloc(n): one slot per page.
    page, note = settings.page_size, None
    if Capability.PAGED not in spec.capabilities:
        page, note = 1, "page size 1: no 'paged' capability (alloc only)"
    report = PoolReport(name, "error", model=kind, page_size=page, note=note)
    began = time.perf_counter()
    ample = _ample_budget(
        make_requests(settings.requests, settings.seed, settings.shape.vocab), page
    )
    try:
        label = "ample"
        caps = spec.capabilities
        report.ample, first = _run_once(
            create, kind, settings, ample, page, _tag(progress, name, label), caps
        )
        label = "constrained"
        report.constrained, second = _run_once(
            create, kind, settings, settings.budget, page, _tag(progress, name, label), caps
        )
    except Unsupported as exc:  # the engine lacks what it needs: not the pool's fault
        report.status, report.reason = "skipped", str(exc)
        report.seconds = round(time.perf_counter() - began, 3)
        return report
    except Exception as exc:  # a broken pool is reported for that pool, never a crash
        report.reason = f"{label} run: {type(exc).__name__}: {exc}"
        report.seconds = round(time.perf_counter() - began, 3)
        return report
    report.differing_requests = sorted(r for r in first if first[r] != second.get(r))
    if kind in REFERENCE_KINDS:
        # Both runs of one pool agree when the pool corrupts every run alike: the tokens must
        # also be the model's over a plain store (bit-reproducible per request, see model).
        requests = make_requests(settings.requests, settings.seed, settings.shape.vocab)
        reference = reference_outputs(kind, settings.shape, settings.seed, requests)
        wrong = [
            r for r in reference if first.get(r) != reference[r] or second.get(r) != reference[r]
        ]
        if wrong:
            report.differing_requests = sorted({*report.differing_requests, *wrong})
            report.reason = (
                f"{len(wrong)} request(s) differ from the same model over a plain reference "
                "store: the pool stores or reads back wrong values, with or without retraction"
            )
    report.identical = not report.differing_requests and first.keys() == second.keys()
    report.status = "identical" if report.identical else "differ"
    report.seconds = round(time.perf_counter() - began, 3)
    return report


def _tag(
    progress: Callable[[str, str, Scheduler], None] | None, name: str, label: str
) -> Callable[[Scheduler], None] | None:
    if progress is None:
        return None
    return lambda scheduler: progress(name, label, scheduler)


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread meanwhile: the tensors are tiny, and on a loaded machine
    intra-op threads spin at every barrier (a 20x slowdown measured on 2 busy cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_demo(
    registry: Registry,
    names: Sequence[str] | None = None,
    settings: DemoSettings | None = None,
    progress: Callable[[str, str, Scheduler], None] | None = None,
) -> list[PoolReport]:
    """Run every pool named (default: every accepted pool of ``registry``), in name order."""
    settings = settings or DemoSettings()
    chosen = registry.names() if names is None else list(names)
    with single_thread():
        return [
            run_pool(n, registry.spec(n), settings, progress, partial(registry.create, n))
            for n in chosen
        ]
