"""Each of this branch's gallery pools fails its own check and no other of the battery."""

from __future__ import annotations

import pytest

from kvcache_core import PoolSpec
from kvcache_core.conformance.behaviour import run_spec

from ._support import failed
from .gallery_inputs import GALLERY


@pytest.mark.parametrize(("check_id", "spec"), GALLERY, ids=[s.name for _, s in GALLERY])
def test_fails_exactly_its_check(check_id: str, spec: PoolSpec) -> None:
    assert failed(run_spec(spec)) == {check_id}
