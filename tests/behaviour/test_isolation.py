"""Isolation: a check that hangs or crashes inside the pool fails that check only, with a
clear finding, and every other check still runs and passes (issue 8: "runs isolated")."""

from __future__ import annotations

import threading

from kvcache_core import PoolConfig, PoolSpec
from kvcache_core.conformance.behaviour import run_spec, select_checks
from kvcache_core.conformance.results.model import Outcome
from kvcache_plugins.mha import MHATokenToKVPool
from kvcache_plugins.mha import create as create_mha

from ._support import builtin_specs

MHA = next(s for s in builtin_specs() if s.name == "mha")
RELEASE = threading.Event()


class HangingSizePool(MHATokenToKVPool):
    """``get_kv_size_bytes`` never returns (until the test releases it)."""

    def get_kv_size_bytes(self) -> int:
        RELEASE.wait(60)
        return super().get_kv_size_bytes()


class CrashingSizePool(MHATokenToKVPool):
    """``get_kv_size_bytes`` raises something that is not a behaviour failure."""

    def get_kv_size_bytes(self) -> int:
        raise RuntimeError("size table not initialised")


def _spec(name: str, pool_class: type[MHATokenToKVPool]) -> PoolSpec:
    def factory(config: PoolConfig) -> tuple[MHATokenToKVPool, object]:
        pool, allocator = create_mha(config)
        pool.__class__ = pool_class
        return pool, allocator

    return PoolSpec(name, pool_class, MHA.allocator_class, factory, MHA.capabilities)


def _by_check(results: list) -> dict[str, object]:
    return {r.check.removeprefix("behaviour/"): r for r in results}


def test_a_hanging_check_times_out_and_the_others_still_pass() -> None:
    spec = _spec("hangs", HangingSizePool)
    others = [c.id for c in select_checks(spec) if c.id != "kv-size-bytes"]
    try:
        (hung,) = run_spec(spec, only=["kv-size-bytes"], timeout_s=1.0)
        # The others run while the hung check's thread is still blocked, with the default
        # timeout: a 1 s budget for every check fails a busy machine's state machine.
        results = _by_check(run_spec(spec, only=others))
    finally:
        RELEASE.set()  # let the abandoned daemon thread finish
    assert hung.outcome is Outcome.FAILED
    (finding,) = hung.findings
    assert "did not finish within 1 s (a hang?)" in finding.message
    assert finding.target == "pool:hangs"
    assert {c: r.outcome for c, r in results.items()} == dict.fromkeys(results, Outcome.PASSED)


def test_a_crash_inside_the_pool_fails_that_check_only_with_a_rerun_snippet() -> None:
    results = _by_check(run_spec(_spec("crashes", CrashingSizePool)))
    crashed = results.pop("kv-size-bytes")
    assert crashed.outcome is Outcome.FAILED
    (finding,) = crashed.findings
    assert "raised RuntimeError: size table not initialised" in finding.message
    assert "test_isolation.py" in finding.message  # where it was raised
    assert "BATTERY['kv-size-bytes'].function(CheckContext(spec, config))" in finding.reproduction
    assert finding.hint
    assert {c: r.outcome for c, r in results.items()} == dict.fromkeys(results, Outcome.PASSED)
