"""``StepSpec``: what every device needs to run one pipelined training step (the lowered schedule,
the placement, the loss, the mesh axes, the cost overrides), pickled to the devices once per
cluster; and the check that the pipeline's and the data-parallel mesh axes are disjoint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import UsageError
from .actions import Schedule
from .placement import Placement

__all__ = ["StepSpec", "check_axes"]


@dataclass(frozen=True)
class StepSpec:
    """What every device needs to run a step (pickled to the devices once)."""

    lowered: Schedule
    placement: Placement
    microbatches: int
    loss: Callable[[Any, Any], Any]
    axis: Any
    dp_axis: Any
    costs: Mapping[str, float] | None
    # another stage program (timeline parallelism): fn(step, stage, microbatch, received) -> (vjp, out, loss)
    stage_forward: Callable[..., Any] | None = None
    shared_axis: Any = None  # stages share one set of weights: sum their gradients over this axis
    # after a B or W accumulated stage s's gradients of microbatch m and was charged from ``start`` to
    # ``end`` on the modelled clock: fn(step, kind, stage, microbatch, start, end) (DDP's buckets on the
    # communication stream, parallel/overlap.py)
    on_grads: Callable[..., bool] | None = None


def check_axes(mesh: Any, axis: Any, dp_axis: Any) -> None:
    """The pipeline's mesh axes and the data-parallel ones must be disjoint (``axis=None`` means
    every axis, so a ``dp_axis`` needs the pipeline's axes named)."""
    if dp_axis is None:
        return
    pipe, dp = mesh.axes(axis), mesh.axes(dp_axis)
    shared = [a for a in pipe if a in dp]
    if shared:
        rest = [a for a in mesh.axes(None) if a not in dp]
        raise UsageError(
            f"the pipeline's mesh axes {pipe} and the data-parallel axes {dp} share {shared}: a device "
            f"cannot be both a pipeline rank and a replica along one axis; give the pipeline the other "
            f"axes, e.g. axis={rest[0] if len(rest) == 1 else tuple(rest)!r}"
        )
