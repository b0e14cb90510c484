"""The battery: importing this package registers every check (one module per concern)."""

from . import (
    allocator,  # noqa: F401
    bad_input,  # noqa: F401
    forwarding,  # noqa: F401
    size,  # noqa: F401
    writes,  # noqa: F401
)
