"""One module per ``kvcache`` subcommand; each exposes ``register(subparsers)``."""

from __future__ import annotations

from types import ModuleType

from . import check, demo, drift, list_plugins, new_pool

#: Subcommands in the order ``kvcache --help`` lists them.
SUBCOMMANDS: tuple[ModuleType, ...] = (list_plugins, check, drift, demo, new_pool)
