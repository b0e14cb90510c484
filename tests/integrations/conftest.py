"""Fixtures of the transformers integration tests: one thread, and each tiny model built once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny models on a shared machine: one torch thread is ~20x faster than two contending
    ones (thread barriers wait on other processes), and results do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


_MODELS: dict[tuple[str, torch.dtype], Any] = {}


@pytest.fixture(scope="session")
def tiny() -> Any:
    """``tiny(name, dtype)``: the seeded tiny model, built once per session and reused."""
    from kvcache_core.integrations._hf_tiny_models import tiny_model

    def get(name: str, dtype: torch.dtype = torch.float32) -> Any:
        key = (name, dtype)
        if key not in _MODELS:
            _MODELS[key] = tiny_model(name, dtype=dtype)
        return _MODELS[key]

    return get
