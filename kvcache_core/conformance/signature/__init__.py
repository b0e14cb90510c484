"""The signature level: imports each class and compares ``inspect.signature`` of every contract
method; discovery runs the same comparison at engine start-up.
"""

from .level import class_location, import_target, run, signature_findings

__all__ = ["class_location", "import_target", "run", "signature_findings"]
