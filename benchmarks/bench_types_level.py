"""Time the checker's types level over every installed built-in plugin, cold and warm.

    .venv/bin/python benchmarks/bench_types_level.py [--runs 5] [--real-torch]

"cold" is a run with an empty mypy cache directory, "warm" a second run on the same one. Each is
repeated ``--runs`` times, interleaved, and reported as min / median wall time of ``run()`` plus
the CPU time of the mypy child process: on a shared machine the minimum and the CPU time are the
numbers to compare (docs/architecture.md, "Performance notes"). Peak memory is not reported:
a forked child's maximum RSS includes the parent's (torch-sized) pages; measure mypy's own
with ``/usr/bin/time -v``.
``--real-torch`` also times mypy on the same generated module against the installed torch (no
stub), once, cold, for comparison.
Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvcache_core.conformance.targets.target import ClassTarget


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _targets() -> list[ClassTarget]:
    from kvcache_core.conformance.targets.plugins import plugin_targets

    targets, errors = plugin_targets()
    for error in errors:
        print(f"skipped: {error.target}: {error.detail}", file=sys.stderr)
    return list(targets)


def _timed(targets: list[ClassTarget], cache: Path) -> tuple[float, float, int]:
    from kvcache_core.conformance.types import level as types_level

    cpu = _children_cpu()
    started = time.perf_counter()
    results = types_level.run(targets, contract_version=2, cache_dir=cache)
    wall = time.perf_counter() - started
    bad = [r for r in results if r.outcome.value not in ("passed",)]
    if bad:
        print(f"warning: {len(bad)} results did not pass, e.g. {bad[0]}", file=sys.stderr)
    return wall, _children_cpu() - cpu, len(results)


def _real_torch(targets: list[ClassTarget]) -> None:
    """mypy on the generated module with site-packages (the real torch), cold, once."""
    from kvcache_core.conformance.members.sources import SourceIndex
    from kvcache_core.conformance.types import level as types_level
    from kvcache_core.conformance.types._gen import MODULE_NAME, TargetPlan, generate

    plans = []
    index = SourceIndex()
    for number, target in enumerate(targets):
        plan = types_level._prepare(target, 2, index)
        if not isinstance(plan, list):
            plans.append(TargetPlan(number, plan.module, plan.target.class_name, plan.members))
    text = generate(plans).text
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / f"{MODULE_NAME}.py").write_text(text)
        root = Path(types_level.__file__).resolve().parents[2]
        env = {**os.environ, "MYPYPATH": str(root)}
        command = [sys.executable, "-m", "mypy", "--follow-imports=silent"]
        command += ["--ignore-missing-imports", "--cache-dir", f"{tmp}/cache"]
        command += ["--config-file", os.devnull, f"{MODULE_NAME}.py"]
        cpu = _children_cpu()
        started = time.perf_counter()
        subprocess.run(command, cwd=tmp, env=env, capture_output=True, check=False)
        wall = time.perf_counter() - started
        print(f"real torch, cold: {wall:.2f} s wall, mypy CPU {_children_cpu() - cpu:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--real-torch", action="store_true")
    args = parser.parse_args()
    targets = _targets()
    print(f"{len(targets)} targets from the installed built-in plugins")
    cold: list[tuple[float, float]] = []
    warm: list[tuple[float, float]] = []
    results = 0
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as cache:
            wall, cpu, results = _timed(targets, Path(cache))
            cold.append((wall, cpu))
            wall, cpu, _ = _timed(targets, Path(cache))
            warm.append((wall, cpu))
    print(f"{results} results per run, {args.runs} runs")
    for name, rows in (("cold", cold), ("warm", warm)):
        walls = [w for w, _ in rows]
        cpus = [c for _, c in rows]
        print(
            f"{name}: wall min {min(walls):.2f} s, median {statistics.median(walls):.2f} s; "
            f"mypy CPU min {min(cpus):.2f} s, median {statistics.median(cpus):.2f} s"
        )
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if args.real_torch:
        _real_torch(targets)


if __name__ == "__main__":
    main()
