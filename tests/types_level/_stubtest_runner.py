"""Run mypy's stubtest on kvcache's torch stub, restricted to the names the stub declares.

Usage: python _stubtest_runner.py <stubs dir>. Prints one line per problem and exits 1 if there
is any; prints ``checked <module> <stub path>`` for every stub module, so the caller can see the
comparison really used kvcache's stub (a vacuous pass is worse than a failure).

Why not ``python -m mypy.stubtest torch``: it imports all ~2,300 torch submodules to look for
stub-less ones, which ``--ignore-missing-stub`` then ignores; here only the modules the stub
defines are built and compared, in about half the time.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mypy import stubtest
from mypy.options import Options


def stub_modules(stubs: Path) -> list[str]:
    modules = []
    for path in sorted((stubs / "torch").rglob("*.pyi")):
        parts = path.relative_to(stubs).with_suffix("").parts
        modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def main() -> int:
    stubs = Path(sys.argv[1]).resolve()
    options = Options()
    options.incremental = False
    options.mypy_path = [str(stubs)]
    options.no_site_packages = True  # only kvcache's stub can answer for torch
    options.python_executable = None
    try:
        modules = stubtest.build_stubs(stub_modules(stubs), options, find_submodules=False)
    except stubtest.StubtestFailure as exc:
        print(f"the stub does not build: {exc}")
        return 1
    problems = 0
    for module in modules:
        stub = stubtest.get_stub(module)
        print(f"checked {module} {stub.path if stub is not None else None}")
        for error in stubtest.test_module(module):
            if error.is_missing_stub():  # torch has thousands of names the stub leaves out
                continue
            problems += 1
            print(error.get_description(concise=True))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
