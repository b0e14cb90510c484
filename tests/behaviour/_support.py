"""Shared by the behaviour-check tests: the pools every check must pass on, the gallery as a
plugin, and running a finding's reproduction the way a user would paste it."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

import kvcache_core
from kvcache_core import PoolSpec, discover
from kvcache_core.conformance.behaviour import run_spec
from kvcache_core.conformance.results.model import CheckResult, Outcome

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kvcache-example-pool"


def example_spec() -> PoolSpec:
    """The third-party example pool's spec (imported from the checkout)."""
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    import kvcache_example_pool

    (spec,) = kvcache_example_pool.kvcache_pool_specs()
    return spec


def builtin_specs() -> list[PoolSpec]:
    registry = discover()
    return [registry.spec(name) for name in registry.names()]


def all_good_specs() -> list[PoolSpec]:
    return [*builtin_specs(), example_spec()]


def failed(results: list[CheckResult]) -> set[str]:
    return {r.check.removeprefix("behaviour/") for r in results if r.outcome is Outcome.FAILED}


def run_one(spec: PoolSpec, check_id: str) -> CheckResult:
    (result,) = run_spec(spec, only=[check_id])
    return result


def exec_reproduction(source: str, monkeypatch: pytest.MonkeyPatch) -> BaseException | None:
    """Run a finding's snippet with the gallery registered as a plugin; what it raised."""
    from . import gallery_inputs

    monkeypatch.setattr(
        kvcache_core, "discover", functools.partial(discover, plugins=[gallery_inputs])
    )
    try:
        exec(compile(source, "<reproduction>", "exec"), {"__name__": "__reproduction__"})
    except BaseException as exc:  # the snippet shows the failure by raising
        return exc
    return None
