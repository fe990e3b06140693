"""Pipeline parallelism: partitioning (by layer, or by tracing any module), schedules as data,
validation, simulation, one executor.

    from virtualpar.pipeline import Pipeline, PipelinedOperation, SCHEDULES, simulate

Schedules are ``dict[rank, list[Action]]`` built by ``SCHEDULES[name](ranks, microbatches, virtual)``;
:func:`validate` checks them, :func:`simulate` times them, :func:`lower` adds the transfers, and
:class:`PipelinedOperation` runs any of them on a cluster (``cluster.execute(op, x, y)``).
"""

from __future__ import annotations

from .actions import COMPUTE, KINDS, TRANSFER, Action, ActionRecord, Schedule
from .device_step import HANDLERS, PipelineError
from .diagram import Box, Diagram
from .executor import PipelinedOperation, format_timeline
from .lower import lower
from .partition import Pipeline, PipelineStage
from .trace import trace_calls
from .traced import TracedPipeline, TracedStage
from .placement import Placement
from .schedules import SCHEDULES, build, default_virtual
from .simulate import DEFAULT_COSTS, PipelineDeadlock, Simulation, check_costs, simulate
from .timeline_grid import Timeline
from .validate import ScheduleError, format_grid, validate

__all__ = [
    "Action", "ActionRecord", "Schedule", "COMPUTE", "TRANSFER", "KINDS", "Placement", "Pipeline",
    "PipelineStage", "SCHEDULES", "build", "default_virtual", "check_costs", "validate",
    "ScheduleError", "format_grid", "simulate", "Simulation", "PipelineDeadlock", "DEFAULT_COSTS",
    "lower", "PipelinedOperation", "PipelineError", "HANDLERS", "format_timeline", "Diagram", "Box",
    "Timeline", "TracedPipeline", "TracedStage", "trace_calls",
]
