"""``kvcache demo``: serve a tiny model on every pool, with and without retraction.

Each selected pool runs twice with the reference engine (``kvcache_core.engine``): with ample
memory, then with ``--budget`` token slots, small enough that decode must retract requests
(offload to the host, free their slots) and resume them later. Greedy tokens must be identical.
Exit codes: 0 every pool identical (or skipped), 1 a pool's tokens differ or it raised,
2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from ..contracts.history import CONTRACT_VERSION
from ._demo_vllm import add_arguments as add_vllm_arguments

if TYPE_CHECKING:  # the engine and discovery import torch: only `run` needs them
    from ..discovery import Registry
    from ..engine import DemoSettings, PoolReport, Scheduler

__all__ = ["SCHEMA_VERSION", "register", "render_json", "render_text", "run"]

#: Version of the JSON document (docs/demo-json-schema.json).
SCHEMA_VERSION = 1

#: ``DemoSettings()``'s defaults, spelled out so that registering the parser (which every
#: ``kvcache`` command does) does not import the engine, hence torch; a test keeps them equal.
DEFAULTS: dict[str, int] = {"requests": 12, "budget": 96, "seed": 0, "page_size": 4}


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="decode with retraction on every pool and check the tokens are identical",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--pool", default="all", metavar="NAME|all", help="pool to run (default: all)"
    )
    parser.add_argument(
        "--requests", type=int, default=DEFAULTS["requests"], metavar="N", help="requests per run"
    )
    parser.add_argument(
        "--budget",
        type=int,
        default=DEFAULTS["budget"],
        metavar="TOKENS",
        help=f"token slots in the constrained run (default: {DEFAULTS['budget']})",
    )
    parser.add_argument(
        "--page-size",
        type=int,
        default=None,
        metavar="P",
        help=f"page size for every pool (default: {DEFAULTS['page_size']}, with per-pool "
        "exceptions shown in the output)",
    )
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"], metavar="S")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--engine",
        choices=("reference", "transformers", "vllm"),
        default="reference",
        help="reference: kvcache's own engine on every pool; transformers: Hugging Face "
        "generate on one pool against its own cache (needs kvcache[hf]); vllm: vLLM instance "
        "A saves into --store, a new process B loads (needs kvcache[vllm])",
    )
    parser.add_argument(
        "--model",
        default="llama",
        metavar="llama|qwen2-swa|deepseek-v3|bamba|PATH",
        help="--engine transformers: a tiny seeded model, or a local checkpoint directory",
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=1,
        metavar="N",
        help="2: retract on instance A, resume on instance B through --store (default: 1)",
    )
    parser.add_argument(
        "--store",
        default="memory:",
        metavar="URL",
        help="snapshot store for --instances 2: memory:, dir:PATH, redis://HOST:PORT/DB, "
        "redis+cluster://HOST:PORT or any installed store's URL",
    )
    add_vllm_arguments(parser)
    parser.set_defaults(run=run)


def discover(**options: Any) -> Registry:
    """``kvcache_core.discover``, imported on first call (discovery imports torch, and so must
    not `kvcache --help`); also the seam tests replace to run the demo on their own pools."""
    from ..discovery import discover as discover_pools

    return discover_pools(**options)


def _settings(args: argparse.Namespace) -> DemoSettings:
    from ..engine import DemoSettings, smallest_budget

    for name in ("requests", "budget"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name} must be positive")
    settings = DemoSettings(requests=args.requests, budget=args.budget, seed=args.seed)
    if args.page_size is not None:
        if args.page_size <= 0:
            raise ValueError("--page-size must be positive")
        settings = DemoSettings(
            requests=args.requests, budget=args.budget, seed=args.seed, page_size=args.page_size
        )
    least = smallest_budget(settings)
    if settings.budget < least:
        raise ValueError(
            f"--budget {settings.budget} cannot hold the longest request alone; use >= {least}"
        )
    return settings


class _Progress:
    """One self-overwriting status line on a terminal; nothing when stderr is not a TTY."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.shown = False
        self.last = 0.0

    def __call__(self, pool: str, run: str, scheduler: Scheduler) -> None:
        if not self.live:
            return
        now = time.monotonic()
        if now - self.last < 0.1:  # a terminal needs ~10 updates a second, not every step
            return
        self.last = now
        s = scheduler.stats
        self.stream.write(
            f"\r\x1b[K{pool} ({run}): step {s.steps}, {len(scheduler.finished)} done, "
            f"{len(scheduler.running)} running, {len(scheduler.retracted)} retracted, "
            f"{s.retractions} retractions"
        )
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def run(args: argparse.Namespace) -> int:
    if getattr(args, "engine", "reference") == "vllm":
        from ._demo_vllm import run as run_vllm

        return run_vllm(args)
    if getattr(args, "engine", "reference") == "transformers":
        if getattr(args, "instances", 1) != 1:
            print(
                "kvcache demo: error: --instances runs the reference engine; "
                "--engine transformers runs in one process",
                file=sys.stderr,
            )
            return 2
        from ._demo_transformers import run as run_transformers

        return run_transformers(args)
    try:
        settings = _settings(args)
    except ValueError as exc:
        print(f"kvcache demo: error: {exc}", file=sys.stderr)
        return 2
    from ..engine import run_demo

    registry = discover()
    names = None if args.pool == "all" else [args.pool]
    if names is not None and args.pool not in registry.accepted:
        known = ", ".join(registry.names()) or "none"
        refused = [r for r in registry.rejected if args.pool in (r.pool, r.plugin.name)]
        why = "".join(f"\n  rejected at discovery: {r}" for r in refused)
        print(
            f"kvcache demo: error: no accepted pool {args.pool!r}; accepted: {known}{why}",
            file=sys.stderr,
        )
        return 2
    if args.instances != 1:
        from .demo_across import run as run_across

        return run_across(args, settings, registry)
    progress = _Progress(sys.stderr)
    try:
        reports = run_demo(registry, names, settings, progress)
    finally:
        progress.close()
    if args.format == "json":
        print(json.dumps(render_json(reports, settings, registry), indent=2))
    else:
        sys.stdout.write(render_text(reports, settings, registry))
    return 1 if any(r.status in ("differ", "error") for r in reports) else 0


def render_json(
    reports: list[PoolReport], settings: DemoSettings, registry: Registry
) -> dict[str, Any]:
    """The JSON document described by docs/demo-json-schema.json."""
    return {
        "schema_version": SCHEMA_VERSION,
        "contract_version": CONTRACT_VERSION,
        "settings": {
            "requests": settings.requests,
            "budget": settings.budget,
            "seed": settings.seed,
            "page_size": settings.page_size,
            "max_running": settings.max_running,
        },
        "pools": [r.to_json() for r in reports],
        "rejected": [
            {"plugin": r.plugin.name, "pool": r.pool, "reason": r.reason} for r in registry.rejected
        ],
        "ok": all(r.status in ("identical", "skipped") for r in reports),
    }


def _size(nbytes: int) -> str:
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024 or unit == "MiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} MiB"  # pragma: no cover


def render_text(reports: list[PoolReport], settings: DemoSettings, registry: Registry) -> str:
    # the pool column fits the longest name (plus two spaces), never less than 12 wide
    w = max([10, *(len(r.pool) for r in reports)]) + 2
    lines = [
        f"kvcache demo: {settings.requests} requests, budget {settings.budget} token slots, "
        f"seed {settings.seed}; each pool runs with ample memory, then within the budget",
        f"{'pool':<{w}}{'model':<10}{'reqs':>5}{'tokens':>7}{'retract':>8}{'resume':>7}"
        f"{'evict':>6}{'offloaded':>11}{'GB/s':>7}{'peak':>6}  {'identical':<10}{'time':>7}",
    ]
    notes: list[str] = []
    for r in reports:
        c = r.constrained
        if r.status in ("identical", "differ") and c is not None:
            gbps = f"{c.offload_gb_per_s:.3f}" if c.offload_gb_per_s is not None else "-"
            lines.append(
                f"{r.pool:<{w}}{r.model or '-':<10}{c.requests:>5}{c.tokens_generated:>7}"
                f"{c.retractions:>8}{c.resumes:>7}{c.evictions:>6}{_size(c.bytes_offloaded):>11}"
                f"{gbps:>7}{c.peak_slots_in_use:>6}  {'yes' if r.identical else 'NO':<10}"
                f"{r.seconds:>6.1f}s"
            )
            if r.differing_requests:
                notes.append(f"{r.pool}: tokens differ in requests {r.differing_requests}")
        elif r.status == "skipped":
            notes.append(f"{r.pool}: skipped ({r.reason})")
        else:
            lines.append(f"{r.pool:<{w}}{r.model or '-':<10}  ERROR: {r.reason}")
        if r.note:
            notes.append(f"{r.pool}: {r.note}")
    notes += [f"rejected at discovery: {rej}" for rej in registry.rejected]
    bad = [r.pool for r in reports if r.status in ("differ", "error")]
    verdict = f"FAILED: {', '.join(bad)}" if bad else "all tokens identical"
    return "\n".join([*lines, *(f"  note: {n}" for n in notes), verdict]) + "\n"
