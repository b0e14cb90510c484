"""The reference engine on every built-in pool: retraction happens, and changes no token."""

from __future__ import annotations

import pytest

from kvcache_core import discover
from kvcache_core.engine import DemoSettings, run_demo, run_pool

from . import broken_pools

#: Small enough for the suite (about a second per pool), big enough to force retractions.
SMALL = DemoSettings(requests=4, budget=64)
BUILT_INS = ("dsa", "hisparse", "mamba", "mha", "mla", "swa")


@pytest.fixture(scope="module")
def registry():
    return discover(allow=list(BUILT_INS))


@pytest.fixture(scope="module")
def broken():
    return discover(plugins=[broken_pools], allow=["mha"])


@pytest.mark.parametrize("name", BUILT_INS)
def test_retraction_changes_no_token(registry, name):
    report = run_pool(name, registry.spec(name), SMALL)
    assert report.status == "identical", report.reason or report.differing_requests
    ample, tight = report.ample, report.constrained
    assert ample is not None and tight is not None
    assert ample.retractions == 0 and tight.retractions >= 2
    assert tight.resumes == tight.retractions
    assert tight.bytes_offloaded > 0 and tight.peak_slots_in_use <= SMALL.budget
    assert ample.tokens_generated == tight.tokens_generated
    assert tight.requests == SMALL.requests
    if name == "hisparse":
        assert tight.evictions > 0  # the device is half the budget: residency churns


@pytest.mark.parametrize(
    "name", ["mamba-drops-state", "swa-window-at-full-slot", "dsa-drops-indexer"]
)
def test_a_broken_pool_makes_the_tokens_differ(broken, name):
    report = run_pool(name, broken.spec(name), SMALL)
    assert report.status == "differ", report.reason
    assert report.identical is False and report.differing_requests


def test_the_default_demo_retracts_at_least_five_times_on_every_pool(registry):
    """Issue 11's acceptance, at the defaults ``kvcache demo`` runs with (a few seconds)."""
    reports = run_demo(registry, list(BUILT_INS), DemoSettings())
    assert [r.pool for r in reports] == list(BUILT_INS)
    for report in reports:
        assert report.status == "identical", (report.pool, report.reason)
        tight = report.constrained
        assert tight is not None and tight.retractions >= 5 and tight.resumes == tight.retractions


def test_a_pool_that_raises_is_reported_and_the_others_still_run(broken, registry):
    reports = run_demo(broken, ["mha-raises", "no-offload", "mamba-no-slots", "mha"], SMALL)
    assert [r.status for r in reports] == ["error", "skipped", "skipped", "identical"]
    assert "constrained run: RuntimeError: offload is broken" in (reports[0].reason or "")
    assert "offload" in (reports[1].reason or "")
    assert "mamba_allocator" in (reports[2].reason or "")


def test_hisparse_at_page_size_4(registry):
    """Evicted partial pages made resident again by ``alloc_decode`` must serve what the store
    holds (issue 7: they served stale device rows, and the tokens differed)."""
    settings = DemoSettings(requests=3, budget=72, page_size=4)
    report = run_pool("hisparse", registry.spec("hisparse"), settings)
    assert report.status == "identical", report.reason or report.differing_requests
    assert report.constrained is not None and report.constrained.evictions > 0


def test_window_slots_that_left_the_window_are_given_back(registry):
    """The SWA run frees window slots as tokens slide out (free_swa), so retraction snapshots
    mark only the window's tokens (docs/pools/swa.md: part ``swa_mask``), and the resumed
    requests still produce the same tokens."""
    masks = []

    def create(config):
        pool, allocator = registry.create("swa", config)
        get_cpu_copy = allocator.get_cpu_copy

        def recording(indices, mamba_indices=None):
            snapshot = get_cpu_copy(indices, mamba_indices=mamba_indices)
            masks.append(snapshot.parts["swa_mask"])
            return snapshot

        allocator.get_cpu_copy = recording
        return pool, allocator

    report = run_pool("swa", registry.spec("swa"), SMALL, create=create)
    assert report.status == "identical", report.reason or report.differing_requests
    assert masks and any(not bool(m.all()) for m in masks)
    assert any(bool(m.any()) for m in masks)
