"""The ``kvcache`` command: a thin dispatcher over one module per subcommand.

Exit codes (for every subcommand): 0 clean, 1 findings or rejected plugins, 2 usage or
internal error.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence

# torch warns at import when NumPy is missing; kvcache never needs NumPy, and a warning a user
# cannot act on must not reach the terminal. Set before the subcommands import torch.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

from . import __version__  # noqa: E402
from .commands import SUBCOMMANDS  # noqa: E402
from .conformance.reporting.report import EXIT_ERROR  # noqa: E402

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcache",
        description="Pluggable, conformance-checked KV-cache pools for LLM serving engines.",
    )
    parser.add_argument(
        "--version", action="version", version=f"kvcache {__version__}", help="show the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in SUBCOMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return EXIT_ERROR
    except Exception as exc:  # an internal error must not look like "findings"
        print(
            f"kvcache {args.command}: internal error: {type(exc).__name__}: {exc}", file=sys.stderr
        )
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
