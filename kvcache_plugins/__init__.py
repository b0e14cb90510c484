"""kvcache's built-in pools and allocators.

Each pool module is a plugin registered through the ``kvcache.pools`` entry point group, exactly
as a third-party package would register one; they import only ``kvcache_core``'s public names.
"""
