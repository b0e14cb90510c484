"""One status line on stderr for long runs, shown only on a terminal.

Why only on a terminal: a person waiting on ``kvcache check`` (mypy, the behaviour battery of
many pools) wants to see it move, while CI logs, pipes and files want the report and nothing
else; the report itself goes to stdout, so a status line on stderr never mixes into it.
"""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """``update(text)`` rewrites the status line; ``done()`` erases it. Silent when the
    stream is not a TTY (or ``enabled=False``)."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty()) if callable(isatty) else False
        self.enabled = enabled
        self._shown = False

    def update(self, text: str) -> None:
        if not self.enabled:
            return
        self.stream.write(f"\r\x1b[K{text}")
        self.stream.flush()
        self._shown = True

    def done(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False
