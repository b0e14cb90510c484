"""kvcache's built-in snapshot stores, each a plugin of the ``kvcache.stores`` entry-point group
registered exactly as a third-party store would be: ``memory:`` (in-process, the default),
``dir:PATH`` (a local or shared directory) and ``redis://HOST:PORT/DB`` (Redis or Valkey)."""
