"""Capabilities are enforced: a spec declaring a capability must satisfy that capability's
Protocol on its pool *and* its allocator. The sliding-window pool whose allocator calls
``free_swa`` something else is rejected by discovery with the reason, reported by
``kvcache check NAME`` at the signature level, refused by the engine (which would otherwise
never release a window slot), and ``--against`` adds Protocols to a plugin's classes."""

from __future__ import annotations

import importlib

import pytest

from kvcache_core import discover
from kvcache_core.conformance.results.model import Outcome

RENAMED = """
import types

from kvcache_core import PoolSpec, hookimpl
from kvcache_plugins import swa
from kvcache_plugins._swa_allocator import SWASlotAllocator

# The built-in SWA allocator with free_swa renamed, as a user porting another engine's
# allocator might leave it.
_methods = {
    k: v for k, v in vars(SWASlotAllocator).items()
    if k not in ("free_swa", "__dict__", "__weakref__")
}
RenamedWindowAllocator = type(
    "RenamedWindowAllocator",
    SWASlotAllocator.__bases__,
    {**_methods, "release_window": SWASlotAllocator.free_swa, "__module__": __name__},
)


# Methods that call zero-argument super() close over SWASlotAllocator; point them at the copy so
# super() resolves in its MRO (the copy is not a subclass: it must not inherit free_swa).
def _rebound(f, cls):
    if not (isinstance(f, types.FunctionType) and "__class__" in f.__code__.co_freevars):
        return f
    cells = tuple(
        types.CellType(cls) if name == "__class__" else cell
        for name, cell in zip(f.__code__.co_freevars, f.__closure__)
    )
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, cells)
    g.__kwdefaults__, g.__qualname__ = f.__kwdefaults__, f.__qualname__
    return g


for _name, _value in list(vars(RenamedWindowAllocator).items()):
    setattr(RenamedWindowAllocator, _name, _rebound(_value, RenamedWindowAllocator))


def create(config):
    pool, allocator = swa.create(config)
    allocator.__class__ = RenamedWindowAllocator
    return pool, allocator


@hookimpl
def kvcache_pool_specs():
    (base,) = swa.kvcache_pool_specs()
    # A lambda, not `create`: a reproduction cannot import it, so it must build the pool from
    # this plugin's own spec (discovery rejects the plugin: discover().create would fail).
    return [PoolSpec("renamed-window", base.pool_class, RenamedWindowAllocator,
                     lambda config: create(config), base.capabilities)]
"""


@pytest.fixture
def renamed(fake_site, isolated_modules):
    fake_site(
        "renamed-window",
        entry_points={"renamedwin": "kv_renamed_window"},
        modules={"kv_renamed_window": RENAMED},
    )
    return importlib.import_module("kv_renamed_window")


def test_discovery_rejects_an_allocator_missing_its_capability_method(renamed) -> None:
    registry = discover(plugins=[renamed], autoload=False)
    assert "renamed-window" not in registry.names()
    (rejection,) = [r for r in registry.rejected if r.pool == "renamed-window"]
    assert "free_swa" in str(rejection)
    assert any(f.method == "free_swa" for f in rejection.findings)


def test_check_by_name_reports_it_at_the_signature_level(run_cli, renamed) -> None:
    run = run_cli("check", "renamed-window", "--level", "signature")
    assert run.code == 1
    missing = [
        (r.target, r.check, f.method)
        for r in run.results
        for f in r.findings
        if f.rule == "missing-method"
    ]
    assert missing == [
        ("kv_renamed_window.RenamedWindowAllocator", "signature:SWAAllocator", "free_swa")
    ]


def test_against_adds_protocols_to_a_plugins_classes_by_role(run_cli) -> None:
    """`--against MLAPool` on the mha plugin: the pool class is also held to MLAPool (and
    fails it), the allocator is not; the declared Protocols are still checked."""
    run = run_cli("check", "mha", "--level", "signature", "--against", "MLAPool")
    assert run.code == 1
    checks = {(r.target.rsplit(".", 1)[-1], r.check) for r in run.results}
    assert ("MHATokenToKVPool", "signature:MLAPool") in checks
    assert ("MHATokenToKVPool", "signature:OffloadablePool") in checks
    assert not any(r.check == "signature:MLAPool" and "Allocator" in r.target for r in run.results)
    failed = {r.check for r in run.results if r.outcome is Outcome.FAILED}
    assert failed == {"signature:MLAPool"}


def test_the_engine_refuses_the_pool_instead_of_skipping_window_release(renamed) -> None:
    from kvcache_core.engine.runner import DemoSettings, run_pool

    spec = renamed.kvcache_pool_specs()[0]
    report = run_pool("renamed-window", spec, DemoSettings(requests=2))
    assert report.status == "error"
    assert "SWAAllocator (allocator)" in (report.reason or "")


def test_the_scheduler_itself_refuses_a_window_pool_without_an_swa_allocator(renamed) -> None:
    from kvcache_core import PoolConfig
    from kvcache_core.engine.model import TinyModel
    from kvcache_core.engine.scheduler import EngineError, Scheduler

    pool, allocator = renamed.create(
        PoolConfig(size=32, layer_num=4, head_num=2, head_dim=16, page_size=4, swa_layer_ids=(1, 3))
    )
    with pytest.raises(EngineError, match="could never release a window slot"):
        Scheduler(TinyModel("swa"), pool, allocator)


def test_the_battery_runs_it_and_its_reproduction_runs_although_rejected(run_cli, renamed) -> None:
    run = run_cli("check", "renamed-window", "--level", "behaviour")
    assert run.code == 1
    failed = {r.check: r for r in run.results if r.outcome is Outcome.FAILED}
    assert set(failed) == {"behaviour/offload-roundtrip"}  # free_swa is not skipped
    (finding,) = failed["behaviour/offload-roundtrip"].findings
    assert "free_swa" in finding.message
    assert "installed_spec('renamed-window')" in finding.reproduction
    # A crash inside the pool is re-run under try and ends in an assert naming what it raised.
    with pytest.raises(AssertionError, match=r"AttributeError.*free_swa"):
        exec(compile(finding.reproduction, "<reproduction>", "exec"), {})
