"""kvcache benchmarks: every figure is a ratio against a baseline measured in the same run,
printed with its target and whether this run meets it.

Run: ``make bench`` (the shapes of docs/architecture.md; several GB of RAM) or
``python benchmarks/bench.py --quick`` (small shapes, seconds). Machines are noisy: variants
are interleaved, so a ratio compares like with like.

1. Allocator cycles per second (``_allocator.py``), first: a process that has just offloaded
   gigabytes slows the naive baseline's concatenations.
2. Offload/reload of every accepted pool (``_offload.py``).
3. ``discover()`` next to bare pluggy (``_discovery.py``).

Drift, the types level and the behaviour battery have scripts of their own (``make bench`` runs
them all).
"""

from __future__ import annotations

import argparse

import torch
from _allocator import bench_allocator
from _discovery import bench_discovery
from _offload import bench_offload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (seconds, < 1 GB)")
    parser.add_argument("--offload", type=int, default=None, help="slots to offload")
    parser.add_argument(
        "--repeat", type=int, default=None, help="rounds per figure (default 9; 3 with --quick)"
    )
    parser.add_argument(
        "--pages", default="64,16", help="page sizes of the whole-page offload figures"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default="", help="comma list: pools, 'allocator', 'discovery'")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    only = {x for x in args.only.split(",") if x} or None
    offload = args.offload or (1024 if args.quick else 4096)
    repeat = args.repeat or (3 if args.quick else 9)
    pages = tuple(int(x) for x in args.pages.split(",") if x)
    # The allocator runs first: after the offload section has allocated and freed gigabytes,
    # the process's malloc state made the naive baseline's 512 KiB concatenations about 300x
    # slower (0.3k instead of 90k cycles/s), which would flatter kvcache's ratio.
    if not only or "allocator" in only:
        bench_allocator(args.quick, repeat)
    bench_offload(args.quick, offload, repeat, only, pages)
    if not only or "discovery" in only:
        bench_discovery(repeat)


if __name__ == "__main__":
    main()
