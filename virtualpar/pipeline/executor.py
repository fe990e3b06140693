"""``PipelinedOperation``: one training step of a pipeline on a cluster, under any schedule.

    op = PipelinedOperation(Pipeline(model, cuts=[2, 4, 6]), "1f1b", microbatches=8,
                            loss=nn.mse_loss, optimizer=nn.SGD(0.1), axis="pp")
    loss = cluster.execute(op, x, y)          # one step: forward, backward, optimizer
    weights = op.state_dict(cluster)          # keyed like model.state_dict()
    print(op.timeline())                      # what ran, per rank, on the modelled clock
    op.save(cluster, "ckpt/")                 # weights, optimizer state, step: one file per stage

The schedule is validated, simulated (a schedule that cannot finish is refused before anything
runs) and lowered once; the stages' weights and optimizer state are placed on a cluster's devices
at the first step the operation runs there, and stay there.  An operation is one training run:
``op.step`` counts its committed steps, and a cluster that does not hold the last of them — a new
one after a device died — gets it placed before its step, from the driver's copy or a checkpoint
(:mod:`virtualpar.checkpoint`, which also gives ``save``, ``load`` and ``configure_recovery``);
it never starts again from the model's weights once a step committed.  Each step puts the batch on the first
stage's devices and the targets on the last's (host traffic), runs
:func:`~virtualpar.pipeline.device_step.run_step` on every device (through
:func:`~virtualpar.pipeline.committed.step_keeping`, which keeps the driver's copy), and returns the mean
microbatch loss.  ``dp_axis`` names a data-parallel mesh axis:
its replicas split the batch and average their gradients.  ``costs`` ({kind: FLOPs}) replaces
the stages' own FLOP counts on the modelled clock, e.g. unit costs on a 1 FLOP/s device to
check a schedule's closed forms on an executed run.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any, Callable, Mapping

import numpy as np

from .. import nn
from ..checkpoint import Recoverable
from ..errors import UsageError
from ..ops.placement import without_cluster_state
from .actions import Action, ActionRecord, Schedule
from .committed import fetch_state, open_spill, place_state, settle_all, step_keeping
from .lower import lower
from .partition import Pipeline
from .placement import Placement
from .schedules import SCHEDULES, build
from .simulate import check_costs, simulate
from .step_spec import StepSpec, check_axes
from .step_timeline import check_clock, check_ran, step_timeline
from .timeline_grid import WIDTH, Timeline, format_timeline
from .validate import validate

__all__ = ["PipelinedOperation", "StepSpec", "check_clock", "check_ran", "format_timeline"]

_IDS = itertools.count()


class PipelinedOperation(Recoverable):
    """One training step of ``pipeline`` on a cluster, run by ``cluster.execute(op, x, y)`` (see the
    module doc).

    ``schedule``: a name in ``SCHEDULES`` (``"gpipe"``, ``"1f1b"``, ...) or a ``(schedule,
    placement)`` pair; ``microbatches`` per step; ``loss(pred, target)``; ``optimizer`` (default
    ``nn.SGD(0.1)``); ``axis``: the mesh axis the pipeline ranks lie along (None: every device);
    ``dp_axis``: a data-parallel axis; ``virtual``: stage chunks per rank of a named schedule (None:
    stages / ranks when that divides); ``costs``: {kind: FLOPs}."""

    def __init__(self, pipeline: Pipeline, schedule: str | tuple[Schedule, Placement], microbatches: int,
                 loss: Callable[[Any, Any], Any] = nn.mse_loss, optimizer: nn.Optimizer | None = None,
                 axis: Any = None, dp_axis: Any = None, virtual: int | None = None,
                 costs: Mapping[str, float] | None = None) -> None:
        self.pipeline = pipeline
        if (
            isinstance(microbatches, bool)
            or not isinstance(microbatches, (int, np.integer))
            or not microbatches > 0
        ):
            raise UsageError(f"PipelinedOperation: microbatches must be a positive int, got {microbatches!r}")
        if isinstance(schedule, str) and schedule not in SCHEDULES:  # here, not at the first execute
            raise UsageError(f"PipelinedOperation: unknown schedule {schedule!r}; choose one of "
                             f"{', '.join(SCHEDULES)} or pass a (schedule, Placement) pair")
        self.microbatches = int(microbatches)
        self.optimizer = optimizer or nn.SGD(0.1)
        check_costs(costs, "PipelinedOperation")
        self.axis, self.dp_axis, self.costs, self.loss = axis, dp_axis, costs, loss
        if isinstance(schedule, str):
            self.schedule_name = schedule
            self._schedule_args = (virtual,)
            self.schedule, self.placement = None, None
        elif isinstance(schedule, tuple) and len(schedule) == 2 and isinstance(schedule[1], Placement):
            self.schedule_name = "custom"
            self.schedule, self.placement = schedule
        else:
            raise UsageError(
                f"PipelinedOperation: schedule must be a name in SCHEDULES ({', '.join(SCHEDULES)}) or "
                f"a (schedule, Placement) pair, got {type(schedule).__name__}"
            )
        self.key = f"pipeline/{next(_IDS)}"
        # the clusters holding this op's weights (PlacedOperation): per cluster "spec" (the step planned
        # for its ranks), "last_records" (its last step's records), "version" (the committed state it holds)
        self.last_records: dict[int, list[ActionRecord]] = {}
        self.all_records: dict[int, list[ActionRecord]] = {}  # per device

    def __copy__(self) -> "PipelinedOperation":
        return self._fresh(without_cluster_state(self.__dict__))

    def __deepcopy__(self, memo: dict) -> "PipelinedOperation":
        state = without_cluster_state(self.__dict__)
        return self._fresh({k: copy.deepcopy(v, memo) for k, v in state.items()})

    def _fresh(self, state: dict) -> "PipelinedOperation":
        """A copy is an operation of its own: a new key on the devices and no clusters yet (sharing
        the key, training the copy trained the original's weights)."""
        new = object.__new__(type(self))
        new.__dict__.update(state, key=f"pipeline/{next(_IDS)}", last_records={}, all_records={})
        if "_rec" in state:  # the committed state travels with the copy; the clusters holding it do not
            new.__dict__["_rec"] = state["_rec"].fork()
        return new

    # -- planning -----------------------------------------------------------------------------------
    def _plan(self, ranks: int) -> StepSpec:
        """The step for ``ranks`` pipeline ranks: a named schedule is built for them (so one operation
        runs on clusters of several sizes); nothing is kept unless every check passed."""
        if self.schedule_name != "custom":
            virtual = self._schedule_args[0]
            inferred = virtual is None and len(self.pipeline) % ranks == 0 and len(self.pipeline) > ranks
            if inferred:
                virtual = len(self.pipeline) // ranks
            try:
                schedule, placement = build(self.schedule_name, ranks, self.microbatches, virtual)
            except UsageError as exc:
                if not inferred:
                    raise
                raise UsageError(
                    f"a pipeline of {len(self.pipeline)} stages on {ranks} pipeline ranks means "
                    f"{virtual} stages per rank, which {self.schedule_name!r} cannot run ({exc.message}); "
                    f"cut the model into {ranks} stages, or choose interleaved_1f1b or looped_bfs"
                ) from None
        else:
            schedule, placement = self.schedule, self.placement
        if placement.stages != len(self.pipeline):
            raise UsageError(
                f"schedule {self.schedule_name!r} on {ranks} pipeline ranks runs {placement.stages} "
                f"stages, but the pipeline has {len(self.pipeline)}; cut the model into "
                f"{placement.stages} stages or change the ranks / virtual chunks"
            )
        if placement.ranks != ranks:
            where = f"the mesh axis {self.axis!r} has {ranks}" if self.axis is not None else \
                f"the cluster has {ranks} devices (pass axis= to run along one mesh axis)"
            raise UsageError(f"the schedule is for {placement.ranks} pipeline ranks; {where}")
        validate(schedule, placement, self.microbatches)
        kinds = {a.kind for acts in schedule.values() for a in acts if a is not None}
        check_costs(self.costs, f"PipelinedOperation({self.schedule_name!r})", needed=kinds)
        simulate(schedule, placement, self.microbatches)  # refuses a schedule that cannot finish
        self.schedule, self.placement = schedule, placement
        return StepSpec(lower(schedule, placement), placement, self.microbatches, self.loss,
                        self.axis, self.dp_axis, self.costs)

    # -- running ------------------------------------------------------------------------------------
    def _ensure_placed(self, cluster: Any) -> StepSpec:
        """The step planned for ``cluster``; the first time, the stages placed there (the model's weights)."""
        mesh = cluster.mesh
        check_axes(mesh, self.axis, self.dp_axis)
        ranks = len(mesh.group_of(0, mesh.axes(self.axis)))
        spec = (self.state_for(cluster) or {}).get("spec")
        if spec is None:
            spec = self._plan(ranks)
            payload = {
                "spec": spec,
                "modules": {s.index: s.module for s in self.pipeline.stages},
                "flops": {s.index: s.action_flops(1) for s in self.pipeline.stages},
                "optimizer": self.optimizer,
            }
            cluster.run(_place, self.key, payload)
            self.hold(cluster, spec=spec)
        return spec

    def execute_on(self, cluster: Any, x: np.ndarray, y: np.ndarray) -> float:
        mesh = cluster.mesh
        spec = self._ensure_placed(cluster)
        self._resume(cluster)  # the last committed state, if this cluster lacks it (checkpoint/recovery.py)
        p, M = spec.placement, self.microbatches
        first = {p.rank_of(0, m) for m in range(M)}
        last = {p.rank_of(p.stages - 1, m) for m in range(M)}
        replicas = sorted({tuple(mesh.group_of(r, mesh.axes(self.dp_axis))) for r in range(mesh.size)}) \
            if self.dp_axis is not None else None
        dp = len(replicas[0]) if replicas else 1
        x, y = np.asarray(x), np.asarray(y)
        if len(x) != len(y):  # found only by the last stage's loss, in microbatch shapes
            raise UsageError(
                f"x has {len(x)} rows and y {len(y)}: a batch's inputs and targets pair row by row"
            )
        if dp > 1 and len(x) % dp:  # unequal replicas' gradients, averaged, are not the batch's mean gradient
            raise UsageError(
                f"a batch of {len(x)} rows does not split into {dp} equal data-parallel replicas "
                f"(mesh axis {self.dp_axis!r}); use a multiple of {dp} rows"
            )
        if (len(x) // dp) % M:  # said by one arbitrary device, with its traceback, before
            raise UsageError(
                f"a batch of {len(x)} rows does not split into {dp * M} equal microbatches: give a "
                f"batch whose rows are a multiple of {dp * M}"
            )
        xs, ys = np.array_split(x, dp), np.array_split(y, dp)
        for r in range(mesh.size):
            pos = mesh.group_of(r, mesh.axes(self.axis)).index(r)
            part = mesh.group_of(r, mesh.axes(self.dp_axis)).index(r) if self.dp_axis is not None else 0
            if pos in first:  # posted: the step's run follows at once (an error surfaces there)
                cluster.put(r, self.key + "/x", xs[part], block=False)
            if pos in last:
                cluster.put(r, self.key + "/y", ys[part], block=False)
        want = self._held(cluster)  # the state version its devices hold, their last step settled
        try:
            replies = cluster.run(step_keeping, self.key, len(xs[0]), want, self._recovery.driver_copy)
        except BaseException:
            self._failed(cluster)
            raise
        self._commit(cluster, [r[3] for r in replies])
        replies = [r[:3] for r in replies]
        self.last_records = {}
        self.all_records = {r: records for r, (_, _, records) in enumerate(replies)}
        for loss, prank, records in replies:  # rank order: the first replica of each pipeline rank
            self.last_records.setdefault(prank, records)
        self.hold(cluster, last_records=self.last_records)
        # the mean over every microbatch: a device's mean weighs as many microbatches as it ended
        # (a strategy may give its workers unequal numbers; data-parallel replicas have equal ones)
        last = Action(p.stages - 1, "F", 0)
        ended = [(loss, sum(1 for a, *_ in records if a._replace(microbatch=0) == last))
                 for loss, _, records in replies if loss is not None]
        return float(sum(loss * n for loss, n in ended) / sum(n for _, n in ended))

    def state_dict(self, cluster: Any) -> dict[str, np.ndarray]:
        """The trained weights, fetched from the devices, keyed like ``model.state_dict()``."""
        check_ran(self, cluster)
        parts = cluster.run(_params, self.key, self._held_current(cluster))
        out: dict[str, np.ndarray] = {}
        names = self._stage_names()  # a stage's own names -> the model's (a traced stage's are the model's)
        for stage_params in parts:
            for s, params in stage_params.items():
                for k, v in params.items():
                    out.setdefault(names[s][k], v)
        return {k: out[k] for k in self.pipeline.model.state_dict()}

    # -- checkpoint hooks (checkpoint/recovery.py) --------------------------------------------------
    _fetch_fn = staticmethod(fetch_state)
    _place_fn = staticmethod(place_state)
    _spill_fn = staticmethod(open_spill)

    def _stage_names(self) -> dict[int, dict[str, str]]:
        """Stage -> {its parameter's name: the model's name for it}."""
        return {st.index: dict(zip(st.module.parameters(), st.parameters())) for st in self.pipeline.stages}

    def _model_weights(self) -> dict[str, np.ndarray]:
        return self.pipeline.model.parameters()

    def _shard_name(self, stage: int) -> str:
        return f"stage{stage}"

    def _layout(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, "stages": len(self.pipeline), "schedule": self.schedule_name,
                "first_layers": [st.first_layer for st in self.pipeline.stages]}

    # -- what ran -----------------------------------------------------------------------------------
    def timeline(self, cluster: Any = None, clock: str = "model", compute_only: bool = True,
                 width: int = WIDTH) -> Timeline:
        """Rank × time grid of the last step as it ran (first data-parallel replica) on ``clock``
        ("model" or "wall"), every line at most ``width`` columns (see :func:`format_timeline`);
        the last step on ``cluster`` when one is given, else the last step on any.  The text is a
        :class:`Timeline`: also
        ``.to_png(path)`` and ``.to_html(path)``, boxes on the same clock, transfers in a lane."""
        return step_timeline(self, cluster, clock, compute_only, width)


def _place(dev: Any, key: str, payload: dict) -> None:
    spec = payload["spec"]
    mine = spec.placement.stages_of(dev.group_rank(spec.axis))  # the stages whose weights it keeps
    dev.state[key] = {
        "spec": spec,
        "modules": dict(payload["modules"]),  # any rank may compute any stage for some microbatch
        "params": {s: payload["modules"][s].parameters() for s in mine},
        "optimizers": {s: copy.deepcopy(payload["optimizer"]) for s in mine},
        "flops": payload["flops"],
    }


def _params(dev: Any, key: str, want: int) -> dict[int, dict[str, np.ndarray]]:
    settle_all(dev.state[key], want, key)
    return dict(dev.state[key]["params"])
