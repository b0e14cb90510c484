"""``kvcache drift`` over every sglang release 0.5.10-0.5.23 and kvcached on the releases it
claims: the whole matrix the suite samples (``tests/test_drift_real_engines.py``).

Prints one line per run (error and warning counts, the errors' verdicts from
``tests/data/drift_truth``, wall time) and exits 1 when an error finding is not in the truth
set as a true drift, or when a historical drift is no longer found. Sources come from the
package index through ``interop/wheels.py`` (cached outside the repository).

Run: ``.venv/bin/python interop/drift_matrix.py`` (``make interop`` does).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "interop")]

import wheels  # noqa: E402

from kvcache_core.conformance.source.drift import analyze  # noqa: E402

SGLANG = [f"0.5.{n}" for n in range(10, 24)]
#: kvcached releases and the sglang releases each claims (README: 0.1.5 ">= v0.4.9", tested to
#: 0.5.10; 0.1.6 ">= v0.5.11", tested to 0.5.20), sampled; the errors expected are PR #411's.
KVCACHED = {
    ("0.1.5", "0.5.10"): set(),
    ("0.1.5", "0.5.15"): {
        ("missing-engine-name", "alloc_extend_kernel"),
        ("missing-engine-name", "alloc_decode_kernel"),
    },
    ("0.1.6", "0.5.11"): set(),
    ("0.1.6", "0.5.15"): set(),
    ("0.1.6", "0.5.20"): set(),
}
FOLDERS = ("srt/mem_cache", "srt/hardware_backend")


def main() -> int:
    truth = ROOT / "tests" / "data" / "drift_truth"
    history = json.loads((truth / "sglang-history.json").read_text(encoding="utf-8"))["drifts"]
    failed = False
    for version in SGLANG:
        try:
            package = wheels.sglang(version)
        except wheels.Unavailable as exc:
            print(f"sglang {version}: skipped ({exc})")
            continue
        os.chdir(package)
        started = time.perf_counter()
        found = [f for r in analyze(list(FOLDERS)) for f in r.findings]
        took = time.perf_counter() - started
        errors = {
            (f.rule, f.target.rsplit(".", 1)[-1], f.method, f.parameter)
            for f in found
            if f.is_error
        }
        expected = {
            (d["rule"], d["class"], d["method"], d["parameter"])
            for d in history
            if d["version"] == version
        }
        wrong, missed = errors - expected, expected - errors
        failed |= bool(wrong or missed)
        print(
            f"sglang {version}: {len(errors)} errors ({len(errors & expected)} true), "
            f"{len(found) - len(errors)} warnings, {took:.2f} s"
            + (f"; NOT TRUE: {sorted(wrong)}" if wrong else "")
            + (f"; MISSED: {sorted(missed)}" if missed else "")
        )
    for (plugin, engine), expected_errors in KVCACHED.items():
        try:
            paths = [
                str(wheels.kvcached(plugin) / "integration" / "sglang"),
                str(wheels.sglang(engine) / "srt" / "mem_cache"),
            ]
        except wheels.Unavailable as exc:
            print(f"kvcached {plugin} on sglang {engine}: skipped ({exc})")
            continue
        started = time.perf_counter()
        found = [f for r in analyze(paths) for f in r.findings]
        took = time.perf_counter() - started
        errors = {(f.rule, f.parameter or "") for f in found if f.is_error}
        ok = errors == expected_errors
        failed |= not ok
        print(
            f"kvcached {plugin} on sglang {engine}: {len(errors)} errors, "
            f"{len(found) - len(errors)} warnings, {took:.2f} s" + ("" if ok else f"; GOT {errors}")
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
