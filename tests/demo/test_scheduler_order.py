"""The reference scheduler's order under memory pressure, as docs/engines.md states it: the
*most recently admitted* running request is retracted, and retracted requests resume (oldest
first) before any new request is admitted.

Why pin it: retracting the oldest request, or admitting new ones ahead of retracted ones,
still produces identical tokens (each request is computed on its own), so the demo's token
comparison cannot see it; only the order of events can.
"""

from __future__ import annotations

import pytest

from kvcache_core import discover
from kvcache_core.engine import DemoSettings, Request, Scheduler, TinyModel, make_requests
from kvcache_core.engine.runner import pool_config, single_thread


class RecordingScheduler(Scheduler):
    """Checks the order at every retraction, resume and prefill."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[tuple[str, int]] = []

    def _retract(self, req: Request) -> None:
        # the newest of the running requests (the list is in admission order)
        assert req is self.running[-1], (req.rid, [r.rid for r in self.running])
        self.events.append(("retract", req.rid))
        super()._retract(req)

    def _resume(self, req: Request) -> bool:
        assert req is self.retracted[0], (req.rid, [r.rid for r in self.retracted])
        resumed = super()._resume(req)
        if resumed:
            self.events.append(("resume", req.rid))
        return resumed

    def _prefill(self, req: Request) -> bool:
        assert not self.retracted, f"request {req.rid} admitted while {len(self.retracted)} wait"
        prefilled = super()._prefill(req)
        if prefilled:
            self.events.append(("prefill", req.rid))
        return prefilled


@pytest.mark.parametrize("name", ["mha"])
def test_the_newest_is_retracted_and_retracted_requests_resume_before_new_ones(name: str) -> None:
    settings = DemoSettings(requests=6, budget=64)
    registry = discover(allow=[name])
    kind = name
    config = pool_config(kind, settings.shape, settings.budget, settings.page_size, 8)
    pool, allocator = registry.create(name, config)
    scheduler = RecordingScheduler(
        TinyModel(kind, settings.shape, settings.seed), pool, allocator, max_running=8
    )
    with single_thread():  # tiny tensors: threads only cost here
        outputs = scheduler.run(
            make_requests(settings.requests, settings.seed, settings.shape.vocab)
        )
    assert len(outputs) == settings.requests
    kinds = [k for k, _ in scheduler.events]
    assert kinds.count("retract") >= 2 and kinds.count("resume") == kinds.count("retract")
    # a retracted request resumes before any request that was waiting is first admitted
    retracted: list[int] = []
    for kind_, rid in scheduler.events:
        if kind_ == "retract":
            retracted.append(rid)
        elif kind_ == "resume":
            assert rid == retracted.pop(0)  # oldest retraction first
        else:
            assert not retracted, (rid, retracted, scheduler.events)
