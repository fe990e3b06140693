"""Labs: graded, visual exercises on the virtual cluster.

    virtualpar lab list
    virtualpar lab start ring-allreduce
    virtualpar lab check ring-allreduce ring-allreduce/ring_allreduce.py [--json]

A lab is a folder — skeleton, background, reference solution — and a checker that runs the
student's code on virtual clusters against hidden cases (several meshes, sizes and dtypes, strict
and shuffled modes), enforces the lab's rules, compares cost with the closed form and with
virtualpar's own implementation, and names the device, the step and the cause of what went wrong.
Third-party labs plug in through the ``virtualpar.labs`` entry point (docs/labs.md).
"""

from __future__ import annotations

from .lab import CheckOptions, Lab
from .registry import ENTRY_POINT_GROUP, available, get
from .report import Report, TestResult
from .student import LabRuleError, RuledDevice, StudentCodeError, load_student

__all__ = ["Lab", "CheckOptions", "Report", "TestResult", "available", "get", "ENTRY_POINT_GROUP",
           "LabRuleError", "RuledDevice", "StudentCodeError", "load_student"]
