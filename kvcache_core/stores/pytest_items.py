"""``pytest --kvcache-store URL``: the store battery as pytest tests, one per check, with ids
like ``test_kvcache_store[redis://127.0.0.1:6379/0-round-trip]``; a skipped check (``ttl`` on a
store without expiry, ``outage`` without a server to stop) shows as skipped with its reason."""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["StoreCheckItem", "store_items"]


class StoreCheckItem(pytest.Item):
    """One store-battery check on one store URL."""

    def __init__(self, *, url: str, check: str, mark: str, **kwargs: Any) -> None:
        from .redact import redact_url

        name = f"test_kvcache_store[{redact_url(url)}-{check}]"
        super().__init__(name=name, nodeid=name, **kwargs)
        self.url, self.check = url, check
        self.add_marker(mark)

    def runtest(self) -> None:
        from .battery import StoreCheckFailure, run_store_check

        result = run_store_check(self.url, self.check)
        if result.status == "skipped":
            pytest.skip(result.message)
        if result.status == "failed":  # the result's URL and message are redacted
            raise StoreCheckFailure(f"store/{self.check} on {result.url}: {result.message}")

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        """The battery's message; a traceback through the harness would only hide it."""
        from .battery import StoreCheckFailure

        if isinstance(excinfo.value, StoreCheckFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


def store_items(session: pytest.Session, urls: list[str], *, mark: str) -> list[StoreCheckItem]:
    """One item per (URL, check), in battery order, each carrying ``mark`` (the plugin
    registers it, and names it, where pytest loads the plugin)."""
    from .battery import STORE_CHECKS

    return [
        StoreCheckItem.from_parent(session, url=url, check=check, mark=mark)
        for url in urls
        for check in STORE_CHECKS
    ]
