"""One module per ``kvcache`` subcommand; each exposes ``register(subparsers)``.

What only the CLI uses lives here too, not in the package root: ``progress`` (the status line
of a long run) and ``scaffold`` (the files ``kvcache new-pool`` writes).
"""

from __future__ import annotations

from types import ModuleType

from . import check, demo, drift, list_plugins, new_pool

#: Subcommands in the order ``kvcache --help`` lists them.
SUBCOMMANDS: tuple[ModuleType, ...] = (list_plugins, check, drift, demo, new_pool)
