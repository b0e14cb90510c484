"""Run mypy once over the generated check module, hermetically and with a warm cache.

Why a subprocess: mypy keeps its whole build in memory; a separate process returns that memory
and cannot be disturbed by (or disturb) what the checker already imported.

Why hermetic: mypy gets ``--no-site-packages`` and a ``mypy_path`` of exactly two entries, the
repository's ``stubs/`` (a small torch stub) and a directory of symlinks to the packages it may
read (kvcache_core and each target's top-level package). So it never type-checks the real torch
(seconds and hundreds of MB on a cold cache), never reads a user's mypy configuration, and a
target installed in site-packages still works (mypy refuses a site-packages dir on its path).
Imported modules are followed silently, which also makes mypy skip every function body that
defines no attribute: the level checks interfaces, not bodies.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "MypyMessage",
    "MypyRun",
    "default_cache_dir",
    "find_stubs_dir",
    "link_roots",
    "run_mypy",
]

_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<severity>error|warning|note): (?P<text>.*)$")
_CODE = re.compile(r"  \[(?P<code>[a-z0-9-]+)\]$")

#: Options of the generated configuration. ``follow_imports = silent`` reports errors only for
#: the check module and lets mypy drop the bodies of followed modules' functions.
_CONFIG = """\
[mypy]
mypy_path = {mypy_path}
no_site_packages = True
follow_imports = silent
ignore_missing_imports = True
implicit_reexport = True
strict_optional = True
warn_unused_configs = False
show_error_codes = True
pretty = False
color_output = False
error_summary = False
show_error_context = False

# kvcache's own machinery defines no contract type; reading it (and the stdlib it pulls in:
# importlib.metadata, inspect, ast, zipfile...) would only cost time on a cold cache.
[mypy-kvcache_core.discovery,kvcache_core.hookspecs,kvcache_core.cli,kvcache_core.commands.*,kvcache_core.conformance.*,kvcache_core.pytest_plugin]
follow_imports = skip
"""


@dataclass
class MypyMessage:
    """One error of the check module, with the notes mypy printed under it."""

    line: int
    text: str
    code: str | None
    notes: list[str] = field(default_factory=list)


@dataclass
class MypyRun:
    """What one mypy run said: errors of the check module, anything else, timing."""

    messages: list[MypyMessage]
    returncode: int
    foreign: list[str]
    stderr: str
    seconds: float

    @property
    def failed(self) -> bool:
        """True when mypy could not check at all (a crash, a blocking error, bad usage)."""
        return self.returncode not in (0, 1) or (self.returncode == 1 and not self.messages)


def find_stubs_dir() -> Path | None:
    """kvcache's torch stubs: ``stubs/`` beside the ``kvcache_core`` package in a checkout or an
    editable install, else ``<prefix>/share/kvcache/stubs`` where a wheel installs them."""
    import kvcache_core

    candidates = [
        Path(kvcache_core.__file__).resolve().parent.parent / "stubs",
        Path(sys.prefix) / "share" / "kvcache" / "stubs",
    ]
    return next((c for c in candidates if (c / "torch" / "__init__.pyi").is_file()), None)


def default_cache_dir() -> Path:
    """``$KVCACHE_CACHE_DIR`` or the user cache (``$XDG_CACHE_HOME``, ``~/.cache``)."""
    explicit = os.environ.get("KVCACHE_CACHE_DIR")
    if explicit:
        return Path(explicit) / "mypy-types"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvcache" / "mypy-types"


def link_roots(mapping: Mapping[str, Path], cache_dir: Path) -> Path:
    """A directory of symlinks ``<name> -> path`` (``<name>.py`` for single-file modules).

    Its location depends only on ``mapping``, so mypy's cache, which is keyed by module path,
    stays warm from one run to the next. It is created under a temporary name and renamed, so
    concurrent runs never see a half-built directory.
    """
    key = "\n".join(f"{name}={path}" for name, path in sorted(mapping.items()))
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    final = cache_dir / "roots" / digest
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=final.parent))
    for name, path in mapping.items():
        link = building / (name if path.is_dir() else f"{name}.py")
        link.symlink_to(path.resolve(), target_is_directory=path.is_dir())
    try:
        building.rename(final)
    except OSError:  # another run won the race; its directory is identical
        shutil.rmtree(building, ignore_errors=True)
    return final


def _parse(stdout: str, module_file: str) -> tuple[list[MypyMessage], list[str]]:
    messages: list[MypyMessage] = []
    foreign: list[str] = []
    for raw in stdout.splitlines():
        match = _LINE.match(raw)
        if match is None or match["file"] != module_file:
            if raw.strip():
                foreign.append(raw)
            continue
        text = match["text"]
        if match["severity"] == "note":
            if messages and messages[-1].line == int(match["line"]):
                messages[-1].notes.append(text)
            continue
        code_match = _CODE.search(text)
        code = code_match["code"] if code_match else None
        if code_match:
            text = text[: code_match.start()]
        messages.append(MypyMessage(int(match["line"]), text, code))
    return messages, foreign


def run_mypy(
    module_text: str,
    *,
    module_name: str,
    search_path: list[Path],
    cache_dir: Path,
    timeout: float = 600.0,
) -> MypyRun:
    """Type-check ``module_text`` as module ``module_name`` against ``search_path``."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=cache_dir))
    module_file = f"{module_name}.py"
    try:
        (work / module_file).write_text(module_text, encoding="utf-8")
        config = work / "mypy.ini"
        config.write_text(
            _CONFIG.format(mypy_path=os.pathsep.join(str(p) for p in search_path)),
            encoding="utf-8",
        )
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("MYPYPATH", "MYPY_CACHE_DIR", "MYPY_FORCE_COLOR", "PYTHONSTARTUP")
        }
        command = [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(config),
            "--cache-dir",
            str(cache_dir / "cache"),
            module_file,
        ]
        started = time.perf_counter()
        try:
            done = subprocess.run(
                command, cwd=work, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return MypyRun([], -1, [], f"mypy did not finish within {timeout:.0f} s", timeout)
        seconds = time.perf_counter() - started
        messages, foreign = _parse(done.stdout, module_file)
        return MypyRun(messages, done.returncode, foreign, done.stderr, seconds)
    finally:
        if not os.environ.get("KVCACHE_KEEP_MYPY_RUN"):
            shutil.rmtree(work, ignore_errors=True)
