"""How long the behaviour battery takes: per pool, per check, and as ``pytest
--kvcache-conformance`` in a fresh process against its baseline (importing torch).

Run: ``.venv/bin/python benchmarks/bench_behaviour.py [--repeat N] [--no-pytest]``. The budget
for the pytest run is 10 s on this 2-core machine; the point of printing the baseline next to it
is that almost all of that run is starting Python and importing torch, which a pool author pays
for any test touching a pool. Figures are the best of ``--repeat`` runs (as ``timeit`` reports):
on a shared machine the median measures the other processes; the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvcache_core import discover  # noqa: E402
from kvcache_core.conformance.behaviour import run_check, select_checks  # noqa: E402

BUDGET_S = 10.0


def _battery(repeat: int) -> None:
    registry = discover()
    print(f"{'pool':<10} {'checks':>6} {'best ms':>9} {'median ms':>10}  slowest check")
    total = 0.0
    for name in registry.names():
        spec = registry.spec(name)
        checks = select_checks(spec)
        runs: list[float] = []
        per_check: dict[str, float] = {}
        for _ in range(repeat):
            started = time.perf_counter()
            for check in checks:
                result = run_check(spec, check)
                per_check[check.id] = min(per_check.get(check.id, 1e9), result.duration_s)
            runs.append(time.perf_counter() - started)
        slowest = max(per_check, key=lambda c: per_check[c]) if per_check else "-"
        total += min(runs)
        print(
            f"{name:<10} {len(checks):>6} {min(runs) * 1000:>9.1f} "
            f"{statistics.median(runs) * 1000:>10.1f}  {slowest} "
            f"({per_check.get(slowest, 0.0) * 1000:.1f} ms)"
        )
    print(f"{'all':<10} {'':>6} {total * 1000:>9.1f}")


def _wall(command: list[str], cwd: str, repeat: int) -> float:
    """Best wall time of ``command`` (its exit code is not checked: pytest exits 5 on no tests)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(command, cwd=cwd, env=env, capture_output=True, check=False)
        best = min(best, time.perf_counter() - started)
    return best


def _pytest_run(repeat: int) -> None:
    pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "kvcache_core.pytest_plugin"]
    # hypothesis's plugin imports all of hypothesis at the end of every run (seconds without a
    # bytecode cache); it is this repository's dev tool, not part of the battery's cost.
    pytest_cmd += ["-p", "no:hypothesispytest"]
    with tempfile.TemporaryDirectory() as empty:  # no tests: only the battery is collected
        torch_s = _wall([sys.executable, "-c", "import torch"], empty, repeat)
        bare_s = _wall([*pytest_cmd, "--co"], empty, repeat)  # exits 5: nothing collected
        battery_s = _wall([*pytest_cmd, "--kvcache-conformance"], empty, repeat)
    verdict = "within" if battery_s < BUDGET_S else "OVER"
    print(
        f"pytest --kvcache-conformance (every installed pool, fresh process): best "
        f"{battery_s:.2f} s, {verdict} the {BUDGET_S:.0f} s budget. Baselines: `import torch` "
        f"{torch_s:.2f} s, pytest without the option {bare_s:.2f} s; the battery's share "
        f"(ratio to their sum) {battery_s / (torch_s + bare_s):.2f}; load average "
        f"{os.getloadavg()[0]:.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-pytest", action="store_true", help="skip the fresh-process run")
    args = parser.parse_args()
    _battery(args.repeat)
    if not args.no_pytest:
        _pytest_run(max(1, min(args.repeat, 3)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
