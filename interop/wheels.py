"""Real engine and plugin sources for the drift measurements, fetched from the package index.

Why downloads and not copies: the measurements are "``kvcache drift`` on sglang (or kvcached)
as released", and shipping their sources here would copy other projects into this repository.
Each release is fetched once per machine with ``pip download --no-deps`` into a cache outside
the repository (``~/.cache/kvcache-interop``, or ``$KVCACHE_INTEROP_CACHE``), and only its
``.py`` files are unpacked there. A fetch that fails (the index is unreachable, or a release is
gone) raises ``Unavailable`` with pip's reason, so a test can skip saying why.

kvcached ships only a source archive whose build step needs a GPU toolchain: pip is asked to
keep the archive it unpacked (``--no-clean``) and its ``.py`` files are taken from there; the
failed metadata step that follows changes nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = ["CACHE", "Unavailable", "kvcached", "sglang"]

CACHE = Path(os.environ.get("KVCACHE_INTEROP_CACHE", Path.home() / ".cache" / "kvcache-interop"))


class Unavailable(RuntimeError):
    """A release could not be fetched; the message says why."""


def _pip(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=900,
    )


def sglang(version: str) -> Path:
    """The unpacked ``sglang`` package of that release (``.../sglang-<version>/sglang``)."""
    folder = CACHE / "src" / f"sglang-{version}"
    done = folder / ".unpacked"
    if done.exists():
        return folder / "sglang"
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if not found:
        run = _pip(
            *("--only-binary=:all:", "--python-version", "3.11"),
            *("--platform", "manylinux_2_34_x86_64", "--platform", "any"),
            *("--dest", str(wheels), f"sglang=={version}"),
        )
        found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
        if not found:
            raise Unavailable(f"pip download sglang=={version}: {run.stderr.strip()[-400:]}")
    with zipfile.ZipFile(found[-1]) as wheel:
        names = [n for n in wheel.namelist() if n.startswith("sglang/") and n.endswith(".py")]
        wheel.extractall(folder, members=names)
    done.touch()
    return folder / "sglang"


def kvcached(version: str) -> Path:
    """The unpacked ``kvcached`` package of that release (``.../kvcached-<version>/kvcached``)."""
    folder = CACHE / "src" / f"kvcached-{version}"
    done = folder / ".unpacked"
    if done.exists():
        return folder / "kvcached"
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TMPDIR": tmp}
        run = _pip("--no-clean", "--dest", str(Path(tmp) / "out"), f"kvcached=={version}", env=env)
        unpacked = sorted(Path(tmp).glob("pip-download-*/kvcached*/kvcached"))
        if not unpacked:
            raise Unavailable(f"pip download kvcached=={version}: {run.stderr.strip()[-400:]}")
        target = folder / "kvcached"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(unpacked[0], target, ignore=shutil.ignore_patterns("*.so", "*.cu", "*.cpp"))
    done.touch()
    return folder / "kvcached"
