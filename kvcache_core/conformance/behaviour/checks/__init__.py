"""The battery: importing this package registers every check (one module per concern).

One import line per module (isort would merge them), so that modules added in parallel merge
without conflicts.
"""
# isort: skip_file

from . import allocator  # noqa: F401
from . import bad_input  # noqa: F401
from . import forwarding  # noqa: F401
from . import isolation  # noqa: F401
from . import offload  # noqa: F401
from . import readback  # noqa: F401
from . import scales  # noqa: F401
from . import size  # noqa: F401
from . import window  # noqa: F401
from . import writes  # noqa: F401
