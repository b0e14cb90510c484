"""Optional integrations of kvcache pools into other libraries' engines.

Each module imports its library only when it is imported itself, so `kvcache_core` stays light.
"""
