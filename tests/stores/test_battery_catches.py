"""Who checks the checker: each store battery check fails on a store broken in its own way,
and the others pass on it (so a failure points at the defect)."""

from __future__ import annotations

import pytest

from kvcache_core.stores import discover_stores
from kvcache_core.stores.battery import run_store_battery, run_store_check
from kvcache_core.stores.local_redis import LocalRedis

from . import broken_stores

REGISTRY = discover_stores(plugins=[broken_stores], allow=[])

# broken store -> the one check that must catch it
CAUGHT_BY = {
    "tornwrites": "concurrent",
    "keepsfirst": "overwrite",
    "ignoresttl": "ttl",
    "takesanything": "bad-input",
    "emptyformissing": "missing-key",
    "truncates": "large",
    "sortsbatches": "batched",
    "ignoresmaxbytes": "max-bytes",
    "deletesexpiredbyname": "expiry-race",
    "encodeskeysunchecked": "bad-input",
}


@pytest.mark.parametrize(("store", "check"), CAUGHT_BY.items())
def test_each_defect_is_caught_by_its_check(store: str, check: str) -> None:
    result = run_store_check(f"{store}:", check, registry=REGISTRY)
    assert result.status == "failed", str(result)


@pytest.mark.parametrize("store", ["keepsfirst", "sortsbatches"])
def test_other_checks_pass_on_a_store_with_one_defect(store: str) -> None:
    cheap = [
        "round-trip",
        "missing-key",
        "overwrite",
        "batched",
        "bad-input",
        "ttl",
        "corrupted-value",
        "max-bytes",
    ]
    failed = {
        r.check
        for r in run_store_battery(f"{store}:", checks=cheap, registry=REGISTRY)
        if r.status == "failed"
    }
    assert failed == {CAUGHT_BY[store]}


def test_a_store_hiding_an_outage_is_caught(redis_server: LocalRedis) -> None:
    url = "hidesoutages" + redis_server.url.removeprefix("redis")
    result = run_store_check(url, "outage", registry=REGISTRY, outage=redis_server)
    assert result.status == "failed" and "did not raise StoreUnavailableError" in result.message
