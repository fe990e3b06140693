"""``TimelineParallel``: a ``SequencePipe`` trained with its sequence split over a mesh axis.

    op = TimelineParallel(model, microbatches=4, optimizer=nn.SGD(0.1))
    loss = cluster.execute(op, inputs, labels)    # inputs: tuple of (N, T, ...) arrays

The sequence (length T) is cut into D equal time segments, D the size of ``model.get_group()``'s
axis; segment i's slice of every input goes to device i, the labels to the last device.  The step
runs on :class:`~virtualpar.pipeline.PipelinedOperation`'s executor with the 1F1B schedule over
the D segments; see :mod:`.sequence_pipe` for the semantics and the makespan's closed form.
"""

from __future__ import annotations

import copy
from typing import Any

from numbers import Integral

import numpy as np

from .. import nn
from ..checkpoint import Recoverable
from ..errors import UsageError
from ..pipeline import build, lower, simulate, validate
from ..pipeline.committed import fetch_state, open_spill, place_state, settle_all, step_keeping
from ..pipeline.executor import StepSpec, check_clock, check_ran, format_timeline
from ..pipeline.simulate import check_costs
from .sequence_pipe import SequencePipe

__all__ = ["TimelineParallel", "stage_forward"]


def stage_forward(c: Any, s: int, m: int, received: Any) -> tuple[Any, Any, float | None]:
    """Segment ``s`` of microbatch ``m`` on this device: from the received states (or the initial
    ones), through the user's ``forward``; the last segment adds ``loss_fn``.  Returns (its vjp,
    the states to hand on, the loss on the last segment)."""
    model: SequencePipe = c.st["model"]
    params = c.st["params"][s]
    inputs = c.xs[m]
    batch = np.shape(inputs[0])[0]
    states = model.initial_states(batch) if received is None else tuple(received)
    k = len(states)
    last = s == c.spec.placement.stages - 1
    if last:
        labels = c.ys[m]

        def fn(p: dict, *st: Any) -> Any:
            outputs, _ = nn.functional_call(model, p, inputs, tuple(st))
            return model.loss_fn(outputs, labels)
    else:
        def fn(p: dict, *st: Any) -> Any:
            _, new_states = nn.functional_call(model, p, inputs, tuple(st))
            return tuple(new_states)
    rec = nn.vjp(fn, *states, params=params)
    if s == 0:  # the initial states are constants: nothing to send back for them
        rec = _NoInputGrad(rec)
    elif k == 1:
        rec = _TupleGrad(rec)
    return (rec, None, float(rec.output)) if last else (rec, rec.output, None)


class _NoInputGrad:
    def __init__(self, rec: Any) -> None:
        self.rec, self.output = rec, rec.output

    def backward(self, dy: Any) -> tuple[None, dict]:
        return None, self.rec.backward(dy)[1]


class _TupleGrad:
    """A one-state model's input gradient as a 1-tuple, like every other state tuple."""

    def __init__(self, rec: Any) -> None:
        self.rec, self.output = rec, rec.output

    def backward(self, dy: Any) -> tuple[tuple, dict]:
        dx, g = self.rec.backward(dy)
        return (dx,), g


class TimelineParallel(Recoverable):
    """One training step of ``model`` (a ``SequencePipe``) with its time axis split over
    ``model.get_group()``.

    ``microbatches`` per step; ``optimizer`` (default ``nn.SGD(0.1)``); ``costs``: ``{"F": flops,
    "B": flops}`` on the modelled clock.  ``cluster.execute(op, inputs, labels)`` (tuples of arrays,
    inputs (N, T, ...) with T a multiple of the axis size) returns the mean microbatch loss;
    ``state_dict(cluster, rank)`` gives the weights, ``timeline(clock)`` the last step."""

    def __init__(self, model: SequencePipe, microbatches: int, optimizer: nn.Optimizer | None = None,
                 costs: dict[str, float] | None = None) -> None:
        if not isinstance(model, SequencePipe):
            raise UsageError(f"TimelineParallel needs a SequencePipe subclass, got {type(model).__name__}")
        check_costs(costs, "TimelineParallel", needed=("F", "B"))
        self.model, self.microbatches = model, microbatches
        self.optimizer = optimizer or nn.SGD(0.1)
        self.costs = costs
        self.axis = model.get_group()
        self.key = f"timeline/{id(self)}"
        # the clusters holding its weights (PlacedOperation): per cluster "version" (the committed
        # state it holds)
        self.last_records: dict[int, list] = {}

    def execute_on(self, cluster: Any, inputs: tuple, labels: tuple) -> float:
        mesh = cluster.mesh
        axes = mesh.axes(self.axis)
        D = len(mesh.group_of(0, axes))
        for name, given in (("inputs", inputs), ("labels", labels)):
            if not isinstance(given, (tuple, list)):
                raise UsageError(
                    f"TimelineParallel: {name} must be a tuple of arrays (each (N, T, ...) for inputs), "
                    f"got {type(given).__name__}"
                )
        inputs, labels = tuple(inputs), tuple(labels)
        if not inputs or np.ndim(inputs[0]) < 2:
            raise UsageError(f"TimelineParallel: inputs[0] must be (N, T, ...), batch then time; got shape "
                             f"{np.shape(inputs[0]) if inputs else 'no inputs'}")
        T = np.shape(inputs[0])[1]
        if T % D:
            raise UsageError(f"a sequence of {T} steps does not split into {D} equal time segments "
                             f"(the size of mesh axis {self.axis!r})")
        self._ensure_placed(cluster)
        self._resume(cluster)  # the last committed state, if this cluster lacks it (checkpoint/recovery.py)
        seg = T // D
        for r in range(mesh.size):
            i = mesh.group_of(r, axes).index(r)
            cluster.put(
                r,
                self.key + "/x",
                tuple(np.ascontiguousarray(a[:, i * seg : (i + 1) * seg]) for a in inputs),
                block=False,
            )
            if i == D - 1:
                cluster.put(r, self.key + "/y", labels, block=False)
        want = self._held(cluster)  # the state version its devices hold, their last step settled
        try:
            replies = cluster.run(step_keeping, self.key, None, want, self._recovery.driver_copy)
        except BaseException:
            self._failed(cluster)
            raise
        self._commit(cluster, [r[3] for r in replies])
        replies = [r[:3] for r in replies]
        self.last_records = {}
        for _, prank, records in replies:
            self.last_records.setdefault(prank, records)
        return float(np.mean([loss for loss, _, _ in replies if loss is not None]))

    def _ensure_placed(self, cluster: Any) -> None:
        """Plan the step for ``cluster``'s axis and place the model's weights there, the first time."""
        if not self.is_placed_on(cluster):
            D = len(cluster.mesh.group_of(0, cluster.mesh.axes(self.axis)))
            sched, placement = build("1f1b", D, self.microbatches)
            validate(sched, placement, self.microbatches)
            simulate(sched, placement, self.microbatches)
            spec = StepSpec(
                lower(sched, placement),
                placement,
                self.microbatches,
                None,
                self.axis,
                None,
                self.costs,
                stage_forward=stage_forward,
                shared_axis=self.axis,
            )
            cluster.run(_place, self.key, spec, self.model, self.optimizer)
            self.hold(cluster)

    # -- checkpoint hooks (checkpoint/recovery.py): one set of weights, every device a copy: one shard
    _fetch_fn = staticmethod(fetch_state)
    _place_fn = staticmethod(place_state)
    _spill_fn = staticmethod(open_spill)

    def _stage_names(self) -> dict[int, dict[str, str]]:
        return {0: {k: k for k in self.model.parameters()}}

    def _model_weights(self) -> dict[str, np.ndarray]:
        return self.model.parameters()

    def _shard_name(self, stage: int) -> str:
        return "model"

    def _layout(self) -> dict[str, Any]:
        return {"kind": "TimelineParallel", "axis": str(self.axis), "replicated": True}

    def state_dict(self, cluster: Any, rank: int = 0) -> dict[str, np.ndarray]:
        """The trained weights (every device of the axis holds the same copy)."""
        check_ran(self, cluster)
        if isinstance(rank, bool) or not isinstance(rank, Integral) or not 0 <= rank < cluster.size:
            raise UsageError(
                f"TimelineParallel.state_dict: rank must be an int in 0..{cluster.size - 1}, got {rank!r}"
            )
        return cluster.run(_weights, self.key, self._held_current(cluster))[rank]

    def timeline(self, clock: str = "auto") -> str:
        """The last step as it ran, one row per time segment's device.  ``clock="auto"`` uses the
        modelled clock when the step declared compute costs (``costs=``), else the wall clock."""
        check_clock(clock, ("auto", "model", "wall"))
        recs = sorted(self.last_records.items())
        if clock == "auto":
            clock = "model" if any(m1 > m0 for _, rs in recs for a, _, _, m0, m1 in rs
                                   if a.is_compute) else "wall"
        rows = {p: [(a, (m0, m1) if clock == "model" else (w0, w1)) for a, w0, w1, m0, m1 in rs]
                for p, rs in recs}
        return f"({clock} clock)\n" + format_timeline(rows)


def _place(dev: Any, key: str, spec: StepSpec, model: SequencePipe, optimizer: nn.Optimizer) -> None:
    s = dev.group_rank(spec.axis)  # this device's time segment
    dev.state[key] = {"spec": spec, "model": model, "params": {s: model.parameters()},
                      "optimizers": {s: copy.deepcopy(optimizer)}, "flops": {s: 0.0}}


def _weights(dev: Any, key: str, want: int) -> dict[str, np.ndarray]:
    settle_all(dev.state[key], want, key)
    (params,) = dev.state[key]["params"].values()
    return {k: np.array(v) for k, v in params.items()}
