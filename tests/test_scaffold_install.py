"""Every kind's scaffold (and both quantised storages) installs into a fresh virtual
environment and passes there.

The claim under test (docs/pool-authors.md, "Depending on kvcache"): a package made by
``kvcache new-pool`` installs outside this checkout, because its kvcache requirement says
where the generating kvcache came from, and then passes ``kvcache check`` at every level and
its own behaviour battery. So the environment here sees this checkout only through that
requirement: a new virtual environment (no system site-packages), no ``PYTHONPATH``, run from a
directory outside the checkout, with a plain ``pip install`` of the scaffolds that lets pip
resolve kvcache (and everything kvcache needs) from the requirement alone.

Why one environment for all of them, and torch linked rather than installed: torch is the
cost (unpacking its wheel takes most of a minute) and it is not what is under test. The fresh
environment gets this interpreter's torch as hard links (a copy where links cannot be made), its
``.dist-info`` included, so pip counts it as installed and resolves everything else itself,
torch's own dependencies too. The scaffolds are built without build isolation (setuptools is
installed into the environment first), which saves an isolated build environment per package.
Then one ``kvcache check`` checks all eight pools and one pytest run collects all eight
packages' tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from importlib import metadata
from pathlib import Path

import pytest

from kvcache_core.commands.scaffold import KINDS, kvcache_requirement

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints" / "torch-cpu.txt"

# One worker runs this whole module (`make unit` passes `--dist loadgroup`): its module fixture
# builds the checkout's wheel in the checkout's own `build/`, and two workers building it at
# once failed with "File exists: build/bdist..." (and built the venv twice).
pytestmark = pytest.mark.xdist_group("fresh-venv")


#: Every kind, and the quantised storages of the kind that has them: (kind, storage).
VARIANTS = [*((kind, "full") for kind in KINDS), ("mha", "int8"), ("mha", "fp8")]


def _names() -> dict[tuple[str, str], str]:
    return {
        (kind, storage): f"fresh-{kind}" if storage == "full" else f"fresh-{kind}-{storage}"
        for kind, storage in VARIANTS
    }


class Fresh:
    """A fresh environment holding the scaffolds: where they are and how to run there."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.home = work / "env"
        self.bin = self.home / "bin"
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.env["PATH"] = os.pathsep.join([str(self.bin), self.env.get("PATH", "")])
        self.env["KVCACHE_CACHE_DIR"] = str(work / "cache")

    def run(self, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in argv],
            cwd=cwd or self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )


def _link_tree(source: Path, target: Path) -> None:
    try:
        shutil.copytree(source, target, copy_function=os.link)
    except OSError:  # another filesystem: copy
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)


def _give_torch(env: Fresh) -> None:
    """This interpreter's torch (and its metadata) into ``env``'s site-packages."""
    dist = metadata.distribution("torch")
    record = next(f for f in dist.files or () if f.name == "METADATA")
    info = Path(str(dist.locate_file(record))).parent
    site = Path(str(dist.locate_file("")))
    scheme = sysconfig.get_paths(vars={"base": str(env.home), "platbase": str(env.home)})
    target = Path(scheme["purelib"])
    tops = (info / "top_level.txt").read_text(encoding="utf-8").split()
    for name in [info.name, *tops]:
        if (site / name).is_dir():
            _link_tree(site / name, target / name)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Fresh:
    work = tmp_path_factory.mktemp("fresh")
    env = Fresh(work)
    for (kind, storage), name in _names().items():
        command = ["new-pool", name, "--kind", kind, "--storage", storage]
        made = subprocess.run(
            [sys.executable, "-m", "kvcache_core.cli", *command],
            cwd=work,
            capture_output=True,
            text=True,
        )
        assert made.returncode == 0, made.stderr
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env.home)
    _give_torch(env)
    pip = [env.bin / "python", "-m", "pip", "install", "--quiet", "-c", CONSTRAINTS]
    tools = env.run(*pip, "setuptools>=68", "wheel")
    assert tools.returncode == 0, f"{tools.stdout}\n{tools.stderr}"
    packages = [f"./{name}[test]" for name in _names().values()]
    done = env.run(*pip, "--no-build-isolation", *packages)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    (work / "elsewhere").mkdir()  # where names are not also directories
    return env


def test_the_requirement_points_at_this_checkout():
    # This suite runs from a checkout (editable or not): a direct reference to it.
    assert kvcache_requirement() == f"kvcache @ {ROOT.as_uri()}"


def test_the_scaffolds_declare_that_requirement(fresh):
    for name in _names().values():
        text = (fresh.work / name / "pyproject.toml").read_text(encoding="utf-8")
        assert f'dependencies = ["kvcache @ {ROOT.as_uri()}"]' in text


def test_kvcache_came_from_the_requirement_not_the_checkout(fresh):
    where = fresh.run(
        fresh.bin / "python", "-c", "import kvcache_core, sys; print(kvcache_core.__file__)"
    )
    assert where.returncode == 0, where.stderr
    location = Path(where.stdout.strip()).resolve()
    assert fresh.home.resolve() in location.parents, location
    assert ROOT not in location.parents


def test_kvcache_check_passes_every_level_for_every_kind(fresh):
    names = list(_names().values())
    check = fresh.run(fresh.bin / "kvcache", "check", *names, cwd=fresh.work / "elsewhere")
    assert check.returncode == 0, f"{check.stdout}\n{check.stderr}"
    assert "0 findings (0 errors, 0 warnings)" in check.stdout, check.stdout
    for name in names:
        assert f"pool:{name}" in check.stdout, check.stdout
    for level in ("source:", "signature:", "types:", "behaviour/"):
        assert level in check.stdout


def test_each_scaffolds_own_tests_pass_there(fresh):
    tests = [f"{name}/tests" for name in _names().values()]
    run = fresh.run(
        fresh.bin / "python",
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--import-mode=importlib",
        "-W",
        "ignore:Failed to initialize NumPy:UserWarning",
        *tests,
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    assert "failed" not in run.stdout
    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed is not None, run.stdout
    # Every package contributes its battery: at least one case per check and package.
    assert int(passed.group(1)) >= 12 * len(VARIANTS), run.stdout


def test_the_fresh_kvcache_scaffolds_with_the_same_requirement(fresh):
    """The generating kvcache is now an install from a directory (PEP 610 ``dir_info``, not
    editable): a package it makes points at the same directory."""
    made = fresh.run(fresh.bin / "kvcache", "new-pool", "again", "--kind", "mla")
    assert made.returncode == 0, made.stderr
    text = (fresh.work / "again" / "pyproject.toml").read_text(encoding="utf-8")
    assert f'dependencies = ["kvcache @ {ROOT.as_uri()}"]' in text
