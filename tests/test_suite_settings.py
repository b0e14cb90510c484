"""What docs/testing.md promises about the suite itself: hypothesis runs under a bounded
profile, and the modules pytester must never import twice are imported before any test."""

from __future__ import annotations

import sys

from hypothesis import settings
from hypothesis.internal.conjecture import engine


def test_hypothesis_runs_under_the_suite_profile_with_bounded_shrinking() -> None:
    assert settings.get_current_profile_name() == "kvcache-suite"
    assert settings.default.deadline is None
    assert settings.default.max_examples == 100
    assert engine.MAX_SHRINKING_SECONDS == 10


def test_torch_and_the_contract_are_imported_before_any_test() -> None:
    for name in ("torch", "kvcache_core.contracts.spec", "kvcache_core.discovery"):
        assert name in sys.modules, name
