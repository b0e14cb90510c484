"""Bad input changes nothing: every malformed call is refused with a ``KVCacheError`` before a
single byte (or a single allocator slot) changes.

Why whole-state comparisons: the classic bug is a write that validates its arguments one at a
time, stores K, then finds V malformed and raises, leaving the cache half-overwritten with the
caller none the wiser (it saw an exception and assumes nothing happened). Only comparing every
buffer before and after the refused call catches that.

Why the cases are Python source: each case is one statement executed against a namespace that
holds the pool, so the reproduction in a finding is literally the code that ran (no second
rendering that could drift from what was checked). Cases run in order on one pool; every case
that is not refused cleanly is reported (one finding per check, naming each case).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ....contracts.snapshot import KVSnapshot
from ....contracts.spec import Capability, PoolConfig
from ....contracts.writeloc import KVWriteLoc
from ....errors import KVCacheError
from .._check import BehaviourFailure, behaviour_check
from .._context import CheckContext, Layer
from .._state import attention_layer_ids, capture, first_difference

__all__ = ["Case", "allocator_observables", "fill_source", "run_cases"]


@dataclass(frozen=True)
class Case:
    """One malformed call: ``call`` is a single Python statement, ``name`` what is wrong."""

    name: str
    call: str


def allocator_observables(allocator: Any) -> dict[str, object]:
    """Everything an allocator lets a caller observe about its free space, by name.

    ``available_size`` always; the per-side sizes of composite allocators (SWA, HiSparse) and
    the request-slot allocator of a hybrid Mamba allocator when they exist, since a refused call
    that moved one side only would not show in the smaller-side ``available_size``.
    """
    seen: dict[str, object] = {"available_size()": allocator.available_size()}
    for name in (
        "full_available_size",
        "swa_available_size",
        "logical_available_size",
        "device_available_size",
    ):
        method = getattr(allocator, name, None)
        if callable(method):
            seen[f"{name}()"] = method()
    requests = getattr(allocator, "mamba_allocator", None)
    if requests is not None and callable(getattr(requests, "available_size", None)):
        seen["mamba_allocator.available_size()"] = requests.available_size()
    return seen


def _caps_source(capabilities: frozenset[Capability]) -> str:
    names = ", ".join(f"Capability({c.value!r})" for c in sorted(capabilities, key=str))
    return f"frozenset({{{names}}})" if capabilities else "frozenset()"


def fill_source(config: PoolConfig, capabilities: frozenset[Capability]) -> list[str]:
    """Source that fills every readable buffer with seeded random values.

    Why: a fresh pool is all zeros, and a refused call that wrongly writes zeros (a reload of a
    snapshot of untouched rows) would change nothing visible.
    """
    layers = attention_layer_ids(config)
    lines = [
        "g = torch.Generator().manual_seed(0)",
        f"for layer_id in {layers}:",
        "    for buf in pool.get_kv_buffer(layer_id):",
        "        buf.copy_(torch.randn(buf.shape, generator=g).to(buf.dtype))",
    ]
    if Capability.INDEXER in capabilities:
        lines += [
            "every = torch.arange(1, pool.size + pool.page_size)",
            f"for layer_id in {layers}:",
            "    pool.set_index_k_scale_buffer(layer_id, every,",
            "        torch.randn(every.numel(), pool.index_head_dim, generator=g),",
            "        torch.rand(every.numel(), generator=g))",
        ]
    if Capability.MAMBA_STATE in capabilities:
        lines += [
            f"for layer_id in {list(config.mamba_layer_ids)}:",
            "    conv, temporal = pool.get_mamba_state(layer_id)",
            "    for t in (*conv, temporal):",
            "        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))",
        ]
    return lines


_IMPORTS = [
    "import dataclasses",
    "from kvcache_core import Capability, KVCacheError, KVSnapshot",
    "from kvcache_core.conformance.behaviour import capture, first_difference",
    "from kvcache_core.conformance.behaviour.checks.bad_input import allocator_observables",
]


def _namespace(pool: Any, allocator: Any, ctx: CheckContext) -> dict[str, Any]:
    return {
        "torch": torch,
        "dataclasses": dataclasses,
        "KVSnapshot": KVSnapshot,
        "KVWriteLoc": KVWriteLoc,
        "Layer": Layer,
        "pool": pool,
        "allocator": allocator,
        "config": ctx.config,
        "ctx": ctx,
    }


_REPRO_HELPER = [
    "problems = []",
    "",
    "def refused_cleanly(case, call):",
    "    # Run one malformed call; record what is wrong with how it was refused.",
    "    before, sizes = capture(pool, config, caps), allocator_observables(allocator)",
    "    try:",
    "        call()",
    "    except KVCacheError as exc:",
    "        print(case, '-> refused:', type(exc).__name__, exc)",
    "    except Exception as exc:",
    "        problems.append(f'{case}: raised {type(exc).__name__}, not a KVCacheError: {exc}')",
    "        return",
    "    else:",
    "        problems.append(f'{case}: the bad call was accepted')",
    "        return",
    "    where = first_difference(before, capture(pool, config, caps))",
    "    if where is not None:",
    "        problems.append(f'{case}: the refused call changed the pool: {where}')",
    "    elif allocator_observables(allocator) != sizes:",
    "        problems.append(f'{case}: the refused call changed the allocator')",
    "",
]


def _repro_cases(cases: Sequence[Case], capabilities: frozenset[Capability]) -> list[str]:
    """Every failing case, each run as the check ran it, then one assert naming them all."""
    lines = [f"caps = {_caps_source(capabilities)}", *_REPRO_HELPER]
    lines += [f"refused_cleanly({case.name!r}, lambda: {case.call})" for case in cases]
    lines.append("assert not problems, 'not refused cleanly: ' + '; '.join(problems)")
    return lines


def run_cases(
    ctx: CheckContext,
    what: str,
    setup: Sequence[str],
    cases: Sequence[Case],
    *,
    hint: str,
    namespace: dict[str, Any] | None = None,
) -> None:
    """Build one pool, run ``setup``, then every case; raise naming *every* case not refused
    cleanly (accepted, refused with a non-kvcache error, or refused after changing state).

    Every case runs even after one failed: a pool that accepts one malformed call may also
    half-apply another, and reporting only the first would hide the second until the first
    is fixed. Each case is compared against the state right before it, so one case's
    damage never shows up as another's.
    """
    pool, allocator = ctx.build()
    ns = _namespace(pool, allocator, ctx)
    ns.update(namespace or {})
    exec(compile("\n".join(setup), f"<{what} setup>", "exec"), ns)
    caps = ctx.capabilities
    failed: list[tuple[Case, str]] = []
    for case in cases:
        before = capture(pool, ctx.config, caps)
        sizes = allocator_observables(allocator)
        problem: str | None = None
        try:
            exec(compile(case.call, f"<{what}: {case.name}>", "exec"), ns)
        except KVCacheError:
            pass
        except Exception as exc:
            problem = f"raised {type(exc).__name__} (not a kvcache_core.errors.KVCacheError): {exc}"
        else:
            problem = "was accepted"
        if problem is None:
            where = first_difference(before, capture(pool, ctx.config, caps))
            if where is not None:
                problem = f"was refused but changed the pool first: {where}"
            else:
                now = allocator_observables(allocator)
                if now != sizes:
                    problem = f"was refused but changed the allocator: {sizes} -> {now}"
        if problem is not None:
            failed.append((case, problem))
    if failed:
        said = [
            f"{what} with {case.name} {problem}; the call: {case.call}" for case, problem in failed
        ]
        count = f"{len(failed)} of {len(cases)} malformed calls not refused cleanly: "
        raise BehaviourFailure(
            count + " | ".join(said),
            reproduction=ctx.reproduction(
                _IMPORTS + list(setup) + _repro_cases([c for c, _ in failed], caps)
            ),
            hint=hint,
        )


# -- writes ------------------------------------------------------------------------------------


def _unknown_layers(config: PoolConfig) -> list[tuple[str, int]]:
    past = config.start_layer + config.layer_num
    return [(f"unknown layer {past}", past), ("unknown layer -1", -1)]


def _slot_cases(call: str, limit_expr: str) -> list[Case]:
    """Range, sign and dtype cases for a call template with ``{loc}`` in it."""
    return [
        Case("an out-of-range slot", call.format(loc=f"torch.tensor([1, 2, {limit_expr}])")),
        Case("a negative slot", call.format(loc="torch.tensor([1, -1, 2])")),
        Case("float slot ids", call.format(loc="torch.tensor([1.0, 2.0, 3.0])")),
    ]


_WRITE_HINT = (
    "check every argument (check_slots for loc, check_rows for each tensor, the layer id) "
    "before writing anything, and raise kvcache_core errors"
)


@behaviour_check("bad-write-rejected", hint=_WRITE_HINT)
def bad_write_rejected(ctx: CheckContext) -> None:
    """Malformed writes (set_kv_buffer, and the MLA / indexer writes when declared) raise a
    ``KVCacheError`` and change no byte of the pool."""
    config, caps = ctx.config, ctx.capabilities
    layers = attention_layer_ids(config)
    first = layers[0]
    setup = [
        *fill_source(config, caps),
        f"layer = Layer({first})",
        f"key, value = pool.get_kv_buffer({first})",
        "slots = torch.tensor([1, 2, 3])",
        "k = torch.randn((3, *key.shape[1:]), generator=g).to(key.dtype)",
        "v = torch.randn((3, *value.shape[1:]), generator=g).to(value.dtype)",
    ]
    limit = "pool.size + pool.page_size"
    cases: list[Case] = []
    for layer in layers:
        cases += _slot_cases(f"pool.set_kv_buffer(Layer({layer}), {{loc}}, k, v)", limit)
    cases += [
        Case(
            "an out-of-range slot in a KVWriteLoc",
            f"pool.set_kv_buffer(layer, KVWriteLoc(torch.tensor([1, 2, {limit}])), k, v)",
        ),
        Case(
            "cache_k with one row too many",
            "pool.set_kv_buffer(layer, slots, torch.cat([k, k[:1]]), v)",
        ),
        Case(
            "cache_k with a wrong last dimension",
            "pool.set_kv_buffer(layer, slots, "
            "torch.randn((3, *key.shape[1:-1], key.shape[-1] + 1), generator=g), v)",
        ),
        Case("integer cache_k", "pool.set_kv_buffer(layer, slots, k.to(torch.int32), v)"),
    ]
    if Capability.MLA not in caps:  # an MLA pool ignores cache_v (documented)
        cases += [
            Case(
                "cache_v with a wrong last dimension",
                "pool.set_kv_buffer(layer, slots, k, "
                "torch.randn((3, *value.shape[1:-1], value.shape[-1] + 1), generator=g))",
            ),
            Case("cache_v with one row too few", "pool.set_kv_buffer(layer, slots, k, v[:2])"),
            Case("integer cache_v", "pool.set_kv_buffer(layer, slots, k, v.to(torch.int32))"),
        ]
    for name, bad in _unknown_layers(config):
        cases.append(Case(name, f"pool.set_kv_buffer(Layer({bad}), slots, k, v)"))
    if Capability.SLIDING_WINDOW in caps:  # window slots are checked against the window
        window_limit = f"{config.swa_size or config.size} + pool.page_size"
        for layer in config.swa_layer_ids:
            cases.append(
                Case(
                    f"an out-of-range swa_loc (window layer {layer})",
                    f"pool.set_kv_buffer(Layer({layer}), KVWriteLoc(slots, "
                    f"swa_loc=torch.tensor([1, 2, {window_limit}])), k, v)",
                )
            )
    for mamba_layer in config.mamba_layer_ids if Capability.MAMBA_STATE in caps else ():
        cases.append(
            Case(
                f"Mamba layer {mamba_layer}",
                f"pool.set_kv_buffer(Layer({mamba_layer}), slots, k, v)",
            )
        )
    if Capability.MLA in caps:
        setup += [
            "nope = torch.randn(3, 1, pool.kv_lora_rank, generator=g)",
            "rope = torch.randn(3, 1, pool.qk_rope_head_dim, generator=g)",
        ]
        cases += _slot_cases("pool.set_mla_kv_buffer(layer, {loc}, nope, rope)", limit)
        cases += [
            Case(
                "a cache_k_nope of the wrong width",
                "pool.set_mla_kv_buffer(layer, slots, torch.cat([nope, nope], -1), rope)",
            ),
            Case(
                "a cache_k_rope with one row too few",
                "pool.set_mla_kv_buffer(layer, slots, nope, rope[:2])",
            ),
            Case(
                "an integer cache_k_rope",
                "pool.set_mla_kv_buffer(layer, slots, nope, rope.to(torch.int32))",
            ),
        ]
        for name, bad in _unknown_layers(config):
            cases.append(Case(name, f"pool.set_mla_kv_buffer(Layer({bad}), slots, nope, rope)"))
    if Capability.INDEXER in caps:
        setup += [
            "index_k = torch.randn(3, pool.index_head_dim, generator=g)",
            "index_scale = torch.rand(3, generator=g)",
        ]
        cases += _slot_cases(
            f"pool.set_index_k_scale_buffer({first}, {{loc}}, index_k, index_scale)", limit
        )
        cases += [
            Case(
                "index_k of the wrong width",
                f"pool.set_index_k_scale_buffer({first}, slots, "
                "torch.cat([index_k, index_k], -1), index_scale)",
            ),
            Case(
                "index_k_scale with one entry too few",
                f"pool.set_index_k_scale_buffer({first}, slots, index_k, index_scale[:2])",
            ),
        ]
        for name, bad in _unknown_layers(config):
            cases.append(
                Case(name, f"pool.set_index_k_scale_buffer({bad}, slots, index_k, index_scale)")
            )
    run_cases(ctx, "a write", setup, cases, hint=_WRITE_HINT)


# -- offload -----------------------------------------------------------------------------------

_OFFLOAD_HINT = (
    "validate indices with check_slots(indices, limit=size + page_size, allow_duplicates=False) "
    "(and mamba_indices likewise) before gathering, so bad input raises InvalidSlotError"
)


def _mamba_limit_source() -> str:
    # Request slots are 1..mamba_size; the first invalid one is mamba_size + 1.
    return "(config.mamba_size or 0) + 1"


@behaviour_check("bad-offload-rejected", requires={Capability.OFFLOAD}, hint=_OFFLOAD_HINT)
def bad_offload_rejected(ctx: CheckContext) -> None:
    """Malformed ``get_cpu_copy`` calls (slot 0, out of range, negative, duplicates, float ids;
    bad ``mamba_indices``) raise a ``KVCacheError`` and change nothing."""
    caps = ctx.capabilities
    setup = fill_source(ctx.config, caps)
    limit = "pool.size + pool.page_size"
    cases = [
        Case("the reserved slot 0", "pool.get_cpu_copy(torch.tensor([1, 0, 2]))"),
        Case("an out-of-range slot", f"pool.get_cpu_copy(torch.tensor([1, {limit}]))"),
        Case("a negative slot", "pool.get_cpu_copy(torch.tensor([1, -1]))"),
        Case("a duplicated slot", "pool.get_cpu_copy(torch.tensor([1, 2, 1]))"),
        Case("float slot ids", "pool.get_cpu_copy(torch.tensor([1.0, 2.0]))"),
    ]
    if Capability.MAMBA_STATE in caps:
        m = _mamba_limit_source()
        call = "pool.get_cpu_copy(torch.tensor([1, 2]), mamba_indices={})"
        cases += [
            Case("mamba_indices naming request slot 0", call.format("torch.tensor([0])")),
            Case("out-of-range mamba_indices", call.format(f"torch.tensor([{m}])")),
            Case("negative mamba_indices", call.format("torch.tensor([-1])")),
            Case("duplicated mamba_indices", call.format("torch.tensor([1, 1])")),
            Case("float mamba_indices", call.format("torch.tensor([1.0])")),
        ]
    run_cases(ctx, "get_cpu_copy", setup, cases, hint=_OFFLOAD_HINT)


# -- reload ------------------------------------------------------------------------------------

_RELOAD_HINT = (
    "check the new indices (check_slots, no duplicates) and the whole snapshot "
    "(expect_snapshot: kind, dtype, count, parts, meta; mamba_indices against the state it "
    "carries) before writing anything"
)


def other_geometry(ctx: CheckContext) -> dict[str, Any]:
    """Config overrides that change what one token's rows look like for this pool kind."""
    config = ctx.config
    if Capability.MLA in ctx.capabilities:
        return {"kv_lora_rank": (config.kv_lora_rank or 4) + 4}
    return {"head_num": config.head_num + 1}


def _wrong_part_source() -> list[str]:
    """Source defining ``widen(snapshot)``: the first part found (children included) one
    column wider, everything else as it was."""
    return [
        "def widen(snap):",
        "    for name, t in snap.parts.items():",
        "        wide = torch.zeros((*t.shape[:-1], t.shape[-1] + 1), dtype=t.dtype)",
        "        return dataclasses.replace(snap, parts={**snap.parts, name: wide})",
        "    for name, child in snap.children.items():",
        "        if child is not None and (child.parts or child.children):",
        "            return dataclasses.replace(",
        "                snap, children={**snap.children, name: widen(child)})",
        "    return snap",
    ]


@behaviour_check("bad-reload-rejected", requires={Capability.OFFLOAD}, hint=_RELOAD_HINT)
def bad_reload_rejected(ctx: CheckContext) -> None:
    """Malformed ``load_cpu_copy`` calls, on the pool and through the allocator, raise a
    ``KVCacheError`` and change no byte and no allocator state: bad new indices, a snapshot
    of another kind, dtype, geometry, layer count or token count, a tampered part, and
    ``mamba_indices`` that do not match the state the snapshot carries."""
    config, caps = ctx.config, ctx.capabilities
    mamba = Capability.MAMBA_STATE in caps
    n = config.page_size * max(1, -(-3 // config.page_size))
    kw = ", mamba_indices=torch.tensor([1])" if mamba else ""
    geometry = other_geometry(ctx)
    overrides = ", ".join(f"{k}={v!r}" for k, v in geometry.items())
    setup = [
        *fill_source(config, caps),
        f"src = allocator.alloc({n})",
        f"snapshot = pool.get_cpu_copy(src{kw})",
        f"dst = allocator.alloc({n})",
        f"other_pool, other_alloc = factory(dataclasses.replace(config, {overrides}))",
        f"other_snapshot = other_pool.get_cpu_copy(other_alloc.alloc({n}){kw})",
        "more_pool, more_alloc = factory(dataclasses.replace(config, "
        "layer_num=config.layer_num + 1))",
        f"more_layers = more_pool.get_cpu_copy(more_alloc.alloc({n}){kw})",
        *_wrong_part_source(),
    ]
    # ``factory`` is the spec under test's own (the reproduction binds the same name to it).
    ns: dict[str, Any] = {"factory": ctx.spec.factory}
    mi = ", mamba_indices=torch.tensor([2])" if mamba else ""
    cases: list[Case] = []
    for target in ("pool", "allocator"):

        def load(snapshot: str, indices: str, extra: str = mi, *, _t: str = target) -> str:
            return f"{_t}.load_cpu_copy({snapshot}, {indices}{extra})"

        via = "" if target == "pool" else " (through the allocator)"
        limit = "pool.size + pool.page_size"
        cases += [
            Case(
                f"new indices naming slot 0{via}",
                load("snapshot", "torch.cat([dst[:-1], torch.tensor([0])])"),
            ),
            Case(
                f"an out-of-range new index{via}",
                load("snapshot", f"torch.cat([dst[:-1], torch.tensor([{limit}])])"),
            ),
            Case(
                f"a negative new index{via}",
                load("snapshot", "torch.cat([dst[:-1], torch.tensor([-1])])"),
            ),
            Case(
                f"duplicated new indices{via}", load("snapshot", "torch.cat([dst[:-1], dst[:1]])")
            ),
            Case(f"float new indices{via}", load("snapshot", "dst.to(torch.float32)")),
            Case(f"one new index too few (another token count){via}", load("snapshot", "dst[:-1]")),
            Case(
                f"a snapshot of another kind{via}",
                load("dataclasses.replace(snapshot, pool_kind='other-kind')", "dst"),
            ),
            Case(
                f"a snapshot of another dtype{via}",
                load("dataclasses.replace(snapshot, dtype=torch.float64)", "dst"),
            ),
            Case(
                f"a snapshot of another geometry ({overrides}){via}", load("other_snapshot", "dst")
            ),
            Case(f"a snapshot of another layer count{via}", load("more_layers", "dst")),
            Case(f"a snapshot with a part one column wider{via}", load("widen(snapshot)", "dst")),
        ]
        if mamba:
            m = _mamba_limit_source()
            cases += [
                Case(
                    f"a snapshot carrying Mamba state loaded without mamba_indices{via}",
                    load("snapshot", "dst", ""),
                ),
                Case(
                    f"a snapshot without Mamba state loaded with mamba_indices{via}",
                    load("pool.get_cpu_copy(src)", "dst"),
                ),
                Case(
                    f"two mamba_indices for one request's state{via}",
                    load("snapshot", "dst", ", mamba_indices=torch.tensor([2, 3])"),
                ),
                Case(
                    f"mamba_indices naming request slot 0{via}",
                    load("snapshot", "dst", ", mamba_indices=torch.tensor([0])"),
                ),
                Case(
                    f"out-of-range mamba_indices{via}",
                    load("snapshot", "dst", f", mamba_indices=torch.tensor([{m}])"),
                ),
            ]
    run_cases(ctx, "load_cpu_copy", setup, cases, hint=_RELOAD_HINT, namespace=ns)
