"""Fetch the sglang wheel ``make bench`` measures drift on, and unpack its Python files.

Why a download and not a vendored tree: the figure is "``kvcache drift`` over sglang as shipped",
and shipping sglang's source here would copy another project into this repository. The wheel is
fetched from the package index with ``pip download`` (pinned version, pinned platform tag, so
every machine measures the same 4,719 files) into ``.bench/`` (git-ignored), and only its
``.py`` files are unpacked: drift reads nothing else.

Run: ``.venv/bin/python benchmarks/fetch_sglang.py`` (``make bench`` does). Prints the package
path; exits 1, saying why, when the index cannot be reached (the benchmark then skips sglang).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

VERSION = "0.5.23"
ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench"
PACKAGE = CACHE / f"sglang-{VERSION}" / "sglang"


def fetch() -> Path:
    """The unpacked package directory (downloading and unpacking it the first time)."""
    done = PACKAGE.parent / ".unpacked"
    if done.exists():
        return PACKAGE
    CACHE.mkdir(exist_ok=True)
    wheels = sorted(CACHE.glob(f"sglang-{VERSION}-*.whl"))
    if not wheels:
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                *("--only-binary=:all:", "--python-version", "3.11"),
                *("--platform", "manylinux_2_34_x86_64", "--dest", str(CACHE)),
                f"sglang=={VERSION}",
            ],
            check=True,
        )
        wheels = sorted(CACHE.glob(f"sglang-{VERSION}-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        names = [n for n in wheel.namelist() if n.startswith("sglang/") and n.endswith(".py")]
        wheel.extractall(PACKAGE.parent, members=names)
    done.touch()
    return PACKAGE


def main() -> int:
    try:
        print(fetch())
    except (subprocess.CalledProcessError, OSError, zipfile.BadZipFile) as exc:
        print(f"fetch_sglang: cannot fetch sglang {VERSION}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
