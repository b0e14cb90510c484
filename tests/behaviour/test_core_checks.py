"""The data checks (write-readback, write-isolation, swa-loc-window, offload-roundtrip,
snapshot-is-copy): every built-in pool and the example plugin pass them, each gallery pool
fails exactly its one check, and a finding's reproduction runs on its own and fails."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from kvcache_core.conformance.behaviour import BATTERY, run_spec, select_checks
from kvcache_core.conformance.results.model import Outcome
from kvcache_core.conformance.targets.plugins import plugin_specs
from kvcache_core.contracts.spec import PoolSpec

from .gallery_core import GALLERY

CORE = (
    "write-readback",
    "write-isolation",
    "swa-loc-window",
    "offload-roundtrip",
    "snapshot-is-copy",
)
BUILTINS = ("mha", "mla", "dsa", "hisparse", "swa", "mamba")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kvcache-example-pool"

#: Where each gallery pool's correct counterpart comes from (its reproduction must pass there).
FIXED = {
    "gallery-view-snapshot": "kvcache_plugins.mha",
    "gallery-flipped-reload": "kvcache_plugins.mha",
    "gallery-shifted-reload": "kvcache_plugins.mha",
    "gallery-ignores-swa-loc": "kvcache_plugins.swa",
    "gallery-drops-mamba-state": "kvcache_plugins.mamba",
    "gallery-leaky-write": "kvcache_plugins.mha",
    "gallery-dsa-no-indexer": "kvcache_plugins.dsa",
    "gallery-sorted-mla-reads": "kvcache_plugins.mla",
}


def _builtin(name: str) -> PoolSpec:
    return {s.name: s for s in plugin_specs(name)}[name]


def _core_results(spec: PoolSpec) -> dict[str, Outcome]:
    only = [c.id for c in select_checks(spec) if c.id in CORE]
    return {r.check.split("/", 1)[1]: r.outcome for r in run_spec(spec, only=only)}


def test_the_core_checks_are_registered():
    import kvcache_core.conformance.behaviour.checks  # noqa: F401  (registers the battery)

    assert set(CORE) <= set(BATTERY)
    assert BATTERY["swa-loc-window"].requires == {"sliding-window"}
    assert BATTERY["offload-roundtrip"].requires == {"offload"}


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_pools_pass_the_core_checks_quickly(name):
    spec = _builtin(name)
    start = time.perf_counter()
    outcomes = _core_results(spec)
    took = time.perf_counter() - start
    failed = {c for c, o in outcomes.items() if o is not Outcome.PASSED}
    assert failed == set(), [
        f.message for r in run_spec(spec, only=sorted(failed)) for f in r.findings
    ]
    assert ("swa-loc-window" in outcomes) == (name == "swa")
    assert took < 2.0, f"{name}: core checks took {took:.2f} s (budget: well under 1 s)"


def test_the_example_plugin_passes_the_core_checks(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import kvcache_example_pool

    (spec,) = kvcache_example_pool.kvcache_pool_specs()
    outcomes = _core_results(spec)
    assert outcomes and all(o is Outcome.PASSED for o in outcomes.values()), outcomes


@pytest.mark.parametrize(("check_id", "spec"), GALLERY, ids=[s.name for _, s in GALLERY])
def test_each_gallery_pool_fails_exactly_its_check(check_id, spec):
    results = run_spec(spec)
    failed = {r.check.split("/", 1)[1] for r in results if r.outcome is not Outcome.PASSED}
    assert failed == {check_id}, [f.message for r in results for f in r.findings]
    (finding,) = next(r for r in results if r.check == f"behaviour/{check_id}").findings
    assert finding.rule == "behaviour-failed" and finding.hint and finding.reproduction


@pytest.mark.parametrize(("check_id", "spec"), GALLERY, ids=[s.name for _, s in GALLERY])
def test_reproduction_runs_alone_fails_on_the_broken_pool_and_passes_on_the_fixed_one(
    check_id, spec
):
    (result,) = run_spec(spec, only=[check_id])
    (finding,) = result.findings
    snippet = finding.reproduction
    compile(snippet, "<reproduction>", "exec")
    with pytest.raises(AssertionError):
        exec(snippet, {"__name__": "reproduction"})
    factory_line = next(line for line in snippet.splitlines() if line.endswith(" as factory"))
    fixed = snippet.replace(factory_line, f"from {FIXED[spec.name]} import create as factory")
    exec(fixed, {"__name__": "reproduction"})


def test_reproduction_of_an_installed_spec_imports_its_factory():
    from kvcache_core.conformance.behaviour import CheckContext, default_config

    spec = _builtin("swa")
    snippet = CheckContext(spec, default_config(spec)).reproduction(["assert pool.size == 32"])
    assert "from kvcache_plugins.swa import create as factory" in snippet
    exec(snippet, {"__name__": "reproduction"})


def test_checks_are_reproducible():
    """Fixed seeds: the same broken pool gives the same finding, word for word."""
    _, spec = GALLERY[1]
    first = [f.message for r in run_spec(spec) for f in r.findings]
    again = [f.message for r in run_spec(spec) for f in r.findings]
    assert first == again and first


def test_gallery_factories_are_importable_by_name():
    for _, spec in GALLERY:
        module = sys.modules[spec.factory.__module__]
        assert getattr(module, spec.factory.__qualname__) is spec.factory


def _exec_steps(spec: PoolSpec, steps: list[str]) -> None:
    from kvcache_core.conformance.behaviour import CheckContext, default_config

    snippet = CheckContext(spec, default_config(spec)).reproduction(steps)
    exec(snippet, {"__name__": "reproduction"})


@pytest.mark.parametrize("name", BUILTINS)
def test_offload_reproductions_run_clean_on_a_correct_pool(name):
    """Every reproduction the offload checks can emit is valid code whose asserts hold on a
    correct pool (so when one fails, it is the pool, not the snippet)."""
    from kvcache_core.conformance.behaviour import CheckContext, default_config
    from kvcache_core.conformance.behaviour.checks.offload import decode_steps, roundtrip_steps

    spec = _builtin(name)
    ctx = CheckContext(spec, default_config(spec))
    pool, _ = ctx.build()
    layer = next(i for i in range(pool.layer_num) if i not in ctx.config.mamba_layer_ids)
    parts = [f"layer {layer} key", f"layer {layer} value"]
    if "mla" in spec.capabilities:
        parts.append(f"layer {layer} mla")
    if "indexer" in spec.capabilities:
        parts += [f"layer {layer} index_k", f"layer {layer} index_k_scale"]
    state = "mamba-state" in spec.capabilities
    if state:
        parts.append(f"mamba layer {ctx.config.mamba_layer_ids[0]} temporal")
    evicts = [False, True] if {"sliding-window", "hisparse"} & spec.capabilities else [False]

    for call in ("pool", "allocator"):
        for evict in evicts:
            for write in (False, True):
                _exec_steps(spec, decode_steps(ctx, pool, call, 5, evict, layer, write))
            for part in parts:
                old_m = torch.tensor([1, 2]) if state else None
                new_m = torch.tensor([3, 4]) if state else None
                steps = roundtrip_steps(
                    ctx, pool, part, call, 7, [1, 2, 3, 4, 5], old_m, new_m, evict
                )
                _exec_steps(spec, steps)


_FORCED = [
    ("readback", "first_mismatch", "write-readback"),
    ("window", "first_difference", "swa-loc-window"),
    ("isolation", "first_difference", "write-isolation"),
    ("offload", "_changed_part", "snapshot-is-copy"),
    ("offload", "first_difference", "snapshot-is-copy"),
]


@pytest.mark.parametrize(
    ("name", "module_name", "function", "check_id"),
    [
        (name, *forced)
        for name in BUILTINS
        for forced in _FORCED
        if forced[2] in {c.id for c in select_checks(_builtin(name))}
    ],
)
def test_every_failure_path_emits_a_reproduction_that_holds_on_a_correct_pool(
    name, module_name, function, check_id, monkeypatch
):
    """Force the k-th comparison of a check to report a difference on a correct pool: the
    finding's reproduction must then run without error (its asserts hold), for every k."""
    import importlib

    from kvcache_core.conformance.behaviour import BehaviourFailure, CheckContext, default_config

    spec = _builtin(name)
    module = importlib.import_module(f"kvcache_core.conformance.behaviour.checks.{module_name}")
    real = getattr(module, function)
    check = BATTERY[check_id]
    forced = 0
    while True:
        calls = [0]

        def fake(
            *args: object, _k: int = forced, _calls: list[int] = calls, **kw: object
        ) -> object:
            _calls[0] += 1
            if _calls[0] - 1 == _k:
                return 0 if function == "first_mismatch" else "forced difference"
            return real(*args, **kw)

        monkeypatch.setattr(module, function, fake)
        try:
            check.function(CheckContext(spec, default_config(spec)))
        except BehaviourFailure as failure:
            monkeypatch.setattr(module, function, real)
            if calls[0] <= forced:  # a real failure before the forced comparison was reached
                pytest.fail(f"{name} fails {check_id}: {failure.message}")
            try:
                exec(failure.reproduction, {"__name__": "reproduction"})
            except AssertionError:  # the forced difference is fake: the snippet must pass
                pytest.fail(f"{name} fails {check_id}: {failure.message}")
        else:
            break  # fewer comparisons than k: every path was forced once
        forced += 1
    assert forced > 0
