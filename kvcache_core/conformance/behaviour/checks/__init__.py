"""The battery: importing this package registers every check (one module per concern)."""

from . import writes  # noqa: F401
