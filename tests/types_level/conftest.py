"""Shared fixtures of the types-level tests: one mypy cache for the whole session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache dir shared by every test: the first mypy run is cold, the others warm."""
    return tmp_path_factory.mktemp("kvcache-mypy-cache")
