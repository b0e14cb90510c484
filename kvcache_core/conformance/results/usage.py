"""The one exception every command turns into exit code 2.

Its own module, with nothing else in it, so that any part of the checker (and the command
modules, which must import little to start fast) can raise it without importing the target
resolution that ``resolve`` does.
"""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """The command line (or configuration) asks for something impossible: exit code 2."""
