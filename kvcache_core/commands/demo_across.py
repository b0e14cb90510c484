"""``kvcache demo --instances 2 --store URL``: retract on instance A, resume on instance B.

The pools run as in the single-instance demo, but a retraction on A moves the request through
the snapshot store to B (``kvcache_core.engine.instances``). Each pool's tokens must equal one
instance's with ample memory. Exit codes: 0 every pool identical (or skipped), 1 a pool differs,
raised, had requests that failed alone (the store went away), or moved nothing through the
store, or the store did not answer before the run (a wrong password, no server), 2 usage error.
The store URL is printed with its secrets replaced by ``***``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..discovery import Registry
    from ..engine import DemoSettings
    from ..engine.instances import InstanceReport

__all__ = ["render_text", "run"]


def run(args: argparse.Namespace, settings: DemoSettings, registry: Registry) -> int:
    """Run the selected pools across two instances sharing ``args.store``; print the verdict."""
    from ..engine.instances import run_across_instances
    from ..errors import StoreError
    from ..stores import discover_stores
    from ..stores.redact import redact_text, redact_url

    if args.instances != 2:
        print("kvcache demo: error: --instances takes 1 or 2", file=sys.stderr)
        return 2
    shown = redact_url(args.store)
    try:
        store = discover_stores().open(args.store)  # a bad URL is a usage error, up front
    except StoreError as exc:
        print(redact_text(f"kvcache demo: error: --store: {exc}", args.store), file=sys.stderr)
        return 2
    try:  # one call before the run: a wrong password or no server fails here, saying so
        store.exists("kvcache-demo:probe")
    except StoreError as exc:
        message = f"kvcache demo: error: the store {shown} does not answer: {exc}"
        print(redact_text(message, args.store), file=sys.stderr)
        return 1
    finally:
        store.close()
    names = registry.names() if args.pool == "all" else [args.pool]
    began = time.perf_counter()
    reports = run_across_instances(registry, names, settings, args.store)
    for report in reports:  # a message may quote the URL (a third-party store's)
        if report.reason:
            report.reason = redact_text(report.reason, args.store)
        report.failed_requests = {
            rid: redact_text(why, args.store) for rid, why in report.failed_requests.items()
        }
    seconds = time.perf_counter() - began
    if args.format == "json":
        doc = {
            "store": shown,
            "instances": 2,
            "pools": [asdict(r) for r in reports],
            "seconds": round(seconds, 3),
            "ok": all(r.status in ("identical", "skipped") for r in reports),
        }
        print(json.dumps(doc, indent=2))
    else:
        sys.stdout.write(render_text(reports, settings, shown, seconds))
    return 0 if all(r.status in ("identical", "skipped") for r in reports) else 1


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.2f} MB"


def render_text(
    reports: list[InstanceReport], settings: DemoSettings, store: str, seconds: float
) -> str:
    """The table: per pool, requests moved A -> B, bytes moved and store throughput."""
    lines = [
        f"kvcache demo: 2 instances sharing {store}; {settings.requests} requests, budget "
        f"{settings.budget} token slots on each; A retracts into the store, B resumes",
        f"{'pool':<12}{'moved':>6}{'bytes':>11}{'put MB/s':>10}{'get MB/s':>10}"
        f"{'kept on A':>10}{'done A/B':>10}  {'identical':<10}",
    ]
    notes = []
    for r in reports:
        if r.status in ("identical", "differ", "failed-requests", "nothing-moved"):
            put = f"{r.put_mb_per_s:.1f}" if r.put_mb_per_s is not None else "-"
            get = f"{r.get_mb_per_s:.1f}" if r.get_mb_per_s is not None else "-"
            same = {
                "identical": "yes",
                "differ": "NO",
                "failed-requests": "yes*",
                "nothing-moved": "moved 0",
            }[r.status]
            lines.append(
                f"{r.pool:<12}{r.moved:>6}{_mb(r.bytes_moved):>11}{put:>10}{get:>10}"
                f"{r.kept_local:>10}{f'{r.finished_on_a}/{r.finished_on_b}':>10}  {same:<10}"
            )
            for rid, why in sorted(r.failed_requests.items()):
                notes.append(f"{r.pool}: request {rid} failed alone on B: {why}")
            if r.differing_requests:
                notes.append(f"{r.pool}: tokens differ in requests {r.differing_requests}")
            if r.reason:
                notes.append(f"{r.pool}: {r.reason}")
        elif r.status == "skipped":
            notes.append(f"{r.pool}: skipped ({r.reason})")
        else:
            lines.append(f"{r.pool:<12}  ERROR: {r.reason}")
    bad = [r.pool for r in reports if r.status not in ("identical", "skipped")]
    verdict = f"FAILED: {', '.join(bad)}" if bad else "all tokens identical across instances"
    lines += [f"  note: {n}" for n in notes]
    lines.append(f"{verdict} ({seconds:.1f}s)")
    return "\n".join(lines) + "\n"
