"""The demo compares against the same model over a plain store, not only two runs of one pool:
a sliding-window pool whose window write also lands in full layer 0 corrupts both of its runs
alike, and must still not be called "identical"."""

from __future__ import annotations

from behaviour.gallery_window import GALLERY  # tests/ is on sys.path (rootdir imports)

from kvcache_core import discover
from kvcache_core.engine.reference import reference_outputs
from kvcache_core.engine.runner import DemoSettings, run_pool, single_thread
from kvcache_core.engine.scheduler import Scheduler, make_requests

SETTINGS = DemoSettings(requests=3)


def test_a_pool_corrupting_both_runs_alike_is_not_identical() -> None:
    spec = dict((s.name, s) for _, s in GALLERY)["gallery-swa-write-also-full"]
    report = run_pool("write-also-full", spec, SETTINGS)
    assert report.status == "differ", report
    assert report.differing_requests
    assert "plain reference store" in (report.reason or "")


def test_the_reference_gives_a_correct_pools_tokens() -> None:
    """Bit for bit: the built-in swa pool, run by the scheduler, equals the reference."""
    from kvcache_core.engine.model import TinyModel
    from kvcache_core.engine.runner import pool_config

    requests = make_requests(SETTINGS.requests, SETTINGS.seed, SETTINGS.shape.vocab)
    config = pool_config("swa", SETTINGS.shape, 512, 4, SETTINGS.max_running)
    pool, allocator = discover().create("swa", config)
    with single_thread():
        got = Scheduler(TinyModel("swa", SETTINGS.shape, SETTINGS.seed), pool, allocator).run(
            requests
        )
        want = reference_outputs("swa", SETTINGS.shape, SETTINGS.seed, requests)
    assert got == want
