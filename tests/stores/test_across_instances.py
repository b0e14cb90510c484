"""Two engine instances through a store: tokens identical to one ample-memory instance for
every built-in pool, and with the store killed mid-run no request is corrupted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcache_core import discover
from kvcache_core.cli import main
from kvcache_core.engine import DemoSettings
from kvcache_core.engine.instances import run_across_instances
from kvcache_core.stores.local_redis import LocalRedis

SETTINGS = DemoSettings(requests=8, budget=64)


_EVERY_POOL = """
import dataclasses, json
from kvcache_core import discover
from kvcache_core.engine import DemoSettings
from kvcache_core.engine.instances import run_across_instances
registry = discover()
settings = DemoSettings(requests=8, budget=64)
reports = run_across_instances(registry, registry.names(), settings, "memory:across-test")
print(json.dumps([dataclasses.asdict(r) for r in reports]))
"""


def test_every_builtin_pool_moves_requests_and_keeps_its_tokens() -> None:
    """Both instances as threads of a fresh process (``memory:``), every pool in one run.

    Under load, instance A runs a pool or two ahead of B; when both shared one queue, B (still
    on one pool) was handed the next pool's snapshots (hisparse refusing a mamba snapshot) or
    waited for an ``end`` it had missed. Each pool now has its own queue. The fresh process
    and the timeout turn any future hang into a failure instead of a stuck CI."""
    done = subprocess.run(
        [sys.executable, "-c", _EVERY_POOL], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(r["pool"] for r in reports) == discover().names()
    for r in reports:
        assert r["status"] == "identical", f"{r['pool']}: {r['status']}: {r['reason']}"
        assert r["moved"] > 0 and r["finished_on_b"] > 0 and r["bytes_moved"] > 0, r
        assert r["finished_on_a"] + r["finished_on_b"] == SETTINGS.requests, r


def test_killing_the_store_mid_run_corrupts_no_request(redis_server: LocalRedis) -> None:
    """After the second snapshot moved, the server is killed: A keeps later retractions and
    resumes them itself; B fails the requests it cannot read back, each alone and saying why;
    every request that finishes has exactly the ample-memory tokens."""
    registry = discover()

    def kill_after_second(moved: int) -> None:
        if moved == 2:
            redis_server.kill()

    [report] = run_across_instances(
        registry, ["mha"], SETTINGS, redis_server.url, after_put=kill_after_second, threads=True
    )
    assert report.differing_requests == [], report
    assert report.status in ("failed-requests", "identical"), report
    assert report.moved == 2 and report.kept_local >= 1, report
    assert len(report.failed_requests) <= 2
    for why in report.failed_requests.values():
        assert (
            why.startswith("fetching the snapshot: StoreUnavailableError: redis://127.0.0.1")
            and "did not answer" in why
        )
    done = report.finished_on_a + report.finished_on_b
    assert done + len(report.failed_requests) == SETTINGS.requests


def test_bad_snapshots_fail_their_requests_alone_and_the_run_goes_on() -> None:
    """Three of the moved snapshots are spoiled in the store right after A put them: one is a
    well-formed snapshot whose parts the pool refuses (another dtype), one a hostile blob, one
    is gone. Each of those requests fails alone with its reason; every other one finishes on
    A or B with the ample-memory tokens."""
    import torch

    from kvcache_core import KVSnapshot
    from kvcache_core.stores import open_store

    registry = discover()
    url = "memory:spoiled-snapshots"
    store = open_store(url)
    seen: set[str] = set()
    deep = b"[" * 50_000 + b"]" * 50_000
    hostile = len(deep).to_bytes(8, "little") + deep

    def spoil(moved: int) -> None:
        keys = set(store._values) - seen  # type: ignore[attr-defined]
        seen.update(keys)
        (key,) = keys
        if moved == 1:
            snap = KVSnapshot.from_bytes(store.get(key))  # type: ignore[arg-type]
            parts = {n: t.to(torch.float64) for n, t in snap.parts.items()}
            wrong = KVSnapshot(snap.pool_kind, snap.dtype, snap.token_count, parts, meta=snap.meta)
            store.put(key, wrong.to_bytes())
        elif moved == 2:
            store.put(key, hostile)
        elif moved == 3:
            store.delete(key)

    [report] = run_across_instances(registry, ["mha"], SETTINGS, url, after_put=spoil, threads=True)
    assert report.moved >= 4, report
    assert report.status == "failed-requests", report
    assert report.differing_requests == [], report
    reasons = sorted(report.failed_requests.values())
    assert len(reasons) == 3, reasons
    assert any(r.startswith("loading the snapshot: SnapshotMismatchError") for r in reasons)
    assert any(
        r.startswith("fetching the snapshot: SnapshotMismatchError") and "deeper" in r
        for r in reasons
    )
    assert any("is not in the store" in r for r in reasons)
    assert report.finished_on_b > 0
    assert report.finished_on_a + report.finished_on_b + 3 == SETTINGS.requests


def test_cli_across_processes_through_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "demo",
            "--instances",
            "2",
            "--store",
            f"dir:{tmp_path}/kv",
            "--pool",
            "mha",
            "--requests",
            "6",
            "--budget",
            "56",
            "--format",
            "json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["ok"], doc
    [pool] = doc["pools"]
    assert pool["status"] == "identical" and pool["moved"] > 0
    left = [p.name for p in (tmp_path / "kv").iterdir()]
    assert left == [".lock"]  # B deleted every snapshot it resumed (the store's lock file stays)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--instances", "3"], "--instances takes 1 or 2"),
        (
            ["--instances", "2", "--store", "ftp://x"],
            "--store: no accepted snapshot store opens ftp:",
        ),
    ],
)
def test_cli_usage_errors(args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--pool", "mha", *args]) == 2
    assert words in capsys.readouterr().err


def test_b_stops_reading_at_its_pools_end() -> None:
    """A runs ahead: its next pool's handoffs follow this pool's ``end`` on the one queue. B
    must stop at the ``end``, leaving them to the next pool's scheduler (reading on loaded a
    snapshot into the wrong pool: a flaky SnapshotMismatchError under load)."""
    from kvcache_core.engine.instances import _END, Handoff, ResumingScheduler, _build
    from kvcache_core.stores import open_store

    _, pool, allocator, model = _build(discover(), "mha", SETTINGS)
    b = ResumingScheduler(
        model, pool, allocator, store=open_store("memory:end-test"), max_running=4
    )
    nxt = Handoff(0, [1, 2], 4, [], 2, 0, "kvcache-demo:x:swa:0", 0)
    inbox: list[object] = [_END, nxt]
    assert b.serve(lambda timeout: inbox.pop(0) if inbox else None) == {}
    assert inbox == [nxt]
