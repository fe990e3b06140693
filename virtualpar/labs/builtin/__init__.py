"""virtualpar's own labs, one subpackage each (``LAB`` in its ``__init__``), in teaching order."""
