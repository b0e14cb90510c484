"""Target resolution: what the user named, turned into the classes to check.

``target`` is what a level receives (``ClassTarget``); ``resolve`` reads paths, ``module:Class``
and plugin or pool names; ``plugins`` loads installed plugins' specs for that, and
``plugin_source`` reads them from source when nothing may be imported.
"""
