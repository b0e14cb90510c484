"""A real redis-server for the store tests: started on 127.0.0.1 at a free port, stopped after.

No mock stands in for Redis in a test that claims the Redis store works. Without
``redis-server`` the Redis tests are skipped locally and fail in CI (``CI`` set), where
``.ci/run`` installs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch  # noqa: F401  (imported before pytester can drop it from sys.modules)

from kvcache_core.stores.local_redis import LocalRedis, redis_server_path


def _require_redis() -> None:
    if redis_server_path() is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is missing in CI: .ci/run should have installed it")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A server shared by a module's tests (each test uses its own keys)."""
    _require_redis()
    with LocalRedis() as server:
        yield server.url


@pytest.fixture
def redis_server() -> Iterator[LocalRedis]:
    """A server of the test's own, which the test may pause, kill and restart."""
    _require_redis()
    with LocalRedis() as server:
        yield server
