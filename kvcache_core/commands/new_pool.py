"""``kvcache new-pool NAME [--kind KIND] [--storage full|int8|fp8] [--dir PATH]``: scaffold an
installable pool package of any kind (mha, mla, dsa, swa, mamba, hisparse).

Why a scaffold: a pool author's first hour goes on packaging (the entry point group, the hook
marker, a battery that runs in their own tests, CI), not on the pool. The scaffold is a package
that installs, is discovered, passes ``kvcache check`` at every level and runs the behaviour
battery from its own tests before its author changes a line, built only on ``kvcache_core``'s
public names, so the author starts from something green and keeps it green.

It never overwrites: a directory that exists and is not empty is refused (an empty one, such
as the one ``mkdir && cd`` just made, is filled). NAME must be a valid distribution name (PEP
508) that also gives an importable module (``my-pool`` -> ``my_pool``), and must not be the
name of an installed pool plugin (discovery would reject both). The package depends on kvcache
where this kvcache came from (a version range for an index install, a direct reference for a
checkout or a wheel; docs/pool-authors.md, "Depending on kvcache").
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from pathlib import Path
from typing import Any

from ..plugin_loader import POOL_ENTRY_POINT_GROUP, entry_points
from .scaffold import KINDS, STORAGES, render, storage_problem

__all__ = ["register", "run"]

_DIST_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "new-pool",
        help="scaffold an installable pool package that passes every check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", metavar="NAME", help="pool and distribution name, e.g. my-pool")
    parser.add_argument(
        "--kind",
        default="mha",
        choices=KINDS,
        help="pool kind to start from (default: mha)",
    )
    parser.add_argument(
        "--storage",
        default="full",
        choices=STORAGES,
        help="how K and V are stored (default: full, the compute dtype; int8/fp8 quantise "
        "with a scale per token, for --kind mha)",
    )
    parser.add_argument(
        "--dir", metavar="PATH", help="directory to create (default: ./NAME); never overwritten"
    )
    parser.set_defaults(run=run)


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a scaffolded pool, or None."""
    if not _DIST_NAME.match(name):
        return (
            f"{name!r} is not a valid distribution name: use letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit (PEP 508), e.g. 'my-pool'"
        )
    module = module_name(name)
    if not module.isidentifier() or keyword.iskeyword(module) or module[0].isdigit():
        return (
            f"{name!r} gives the module name {module!r}, which Python cannot import: "
            "start the name with a letter"
        )
    taken = {ep.name for ep in entry_points(POOL_ENTRY_POINT_GROUP)}
    if name.lower() in taken:
        return (
            f"a pool plugin named {name!r} is already installed; discovery rejects two plugins "
            "of one name, so pick another"
        )
    return None


def module_name(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def run(args: argparse.Namespace) -> int:
    name: str = args.name
    problem = name_problem(name)
    if problem is not None:
        print(f"kvcache new-pool: error: {problem}", file=sys.stderr)
        return 2
    problem = storage_problem(args.kind, args.storage)
    if problem is not None:
        print(f"kvcache new-pool: error: {problem}", file=sys.stderr)
        return 2
    target = Path(args.dir if args.dir is not None else name)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        print(
            f"kvcache new-pool: error: {target} already exists and is not an empty directory; "
            "nothing was written (choose another --dir)",
            file=sys.stderr,
        )
        return 2
    files = render(name, module_name(name), args.kind, storage=args.storage)
    for relative, text in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    storage = "" if args.storage == "full" else f", {args.storage} storage"
    print(f"created {target}/ with pool {name!r} ({args.kind}{storage}):")
    for relative in sorted(files):
        print(f"  {relative}")
    print(
        f"next: cd {target} && pip install -e . && kvcache check {name} && pytest",
    )
    return 0
