"""bad-write/offload/reload-rejected: every good pool refuses every malformed call cleanly;
a pool that half-applies a write or lets a raw torch error escape is caught, named, and its
reproduction shows the failure when run."""

from __future__ import annotations

import re

import pytest

from kvcache_core import PoolSpec

from ._support import all_good_specs, exec_reproduction, run_one
from .gallery_inputs import GALLERY

IDS = ["bad-write-rejected", "bad-offload-rejected", "bad-reload-rejected"]
GOOD = all_good_specs()
BROKEN = dict((spec.name, spec) for _, spec in GALLERY)


@pytest.mark.parametrize("check_id", IDS)
@pytest.mark.parametrize("spec", GOOD, ids=[s.name for s in GOOD])
def test_good_pools_refuse_bad_input_cleanly(spec: PoolSpec, check_id: str) -> None:
    result = run_one(spec, check_id)
    assert result.outcome.value == "passed", result.findings


def test_half_applied_write_is_caught_with_its_case_and_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = run_one(BROKEN["gallery-half-write"], "bad-write-rejected")
    (finding,) = result.findings
    assert "cache_v with a wrong last dimension" in finding.message
    assert "changed the pool first: layer 0 key: slot 1 differs" in finding.message
    assert "pool.set_kv_buffer(layer, slots, k, torch.randn(" in finding.reproduction
    shown = exec_reproduction(finding.reproduction, monkeypatch)
    assert isinstance(shown, AssertionError)
    assert "the refused call changed the pool: layer 0 key: slot 1" in str(shown)


def test_raw_index_error_is_named_as_not_a_kvcache_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = run_one(BROKEN["gallery-raw-index-error"], "bad-offload-rejected")
    (finding,) = result.findings
    assert "with an out-of-range slot raised IndexError (not a" in finding.message
    shown = exec_reproduction(finding.reproduction, monkeypatch)
    assert isinstance(shown, AssertionError)
    assert "raised IndexError, not a KVCacheError" in str(shown)


def test_good_pool_reproduction_runs_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same snippet on a correct pool runs to the end: it is the check, not noise."""
    result = run_one(BROKEN["gallery-half-write"], "bad-write-rejected")
    source, swapped = re.subn(
        r"^from \S+ import _half_write as factory$",
        "from kvcache_plugins.mha import create as factory",
        result.findings[0].reproduction,
        flags=re.M,
    )
    assert swapped == 1
    assert exec_reproduction(source, monkeypatch) is None


def test_an_accepted_bad_reload_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload that skips its snapshot checks fails bad-reload-rejected at the first case
    they would have caught: the token count (torch's own error escapes instead)."""
    from kvcache_plugins.mha import MHATokenToKVPool, create

    def lax_check(self: MHATokenToKVPool, snapshot: object, token_count: int) -> object:
        return snapshot

    monkeypatch.setattr(MHATokenToKVPool, "check_snapshot", lax_check)
    spec = next(s for s in GOOD if s.name == "mha")
    assert spec.factory is create
    result = run_one(spec, "bad-reload-rejected")
    (finding,) = result.findings
    assert "with one new index too few (another token count) raised" in finding.message
    assert "pool.load_cpu_copy(snapshot, dst[:-1])" in finding.message
    shown = exec_reproduction(finding.reproduction, monkeypatch)  # the patch still applies
    assert isinstance(shown, AssertionError)
    assert "raised IndexError, not a KVCacheError" in str(shown)
