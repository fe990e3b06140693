"""A pipeline of any ``nn.Module``, cut at named calls of its traced forward, run by the one executor.

    pipe = TracedPipeline(model, (x[:2],), cuts=["blocks.2"])     # or TracedPipeline.balanced(model, (x,), 2)
    op = TracedPipelineOperation(pipe, "1f1b", microbatches=4, loss=nn.cross_entropy, optimizer=nn.AdamW())
    loss = cluster.execute(op, x, y); weights = op.state_dict(cluster)

The model is traced once (:mod:`.trace`); each stage's forward replays the model's own ``forward``
over its calls, and the executor (:func:`virtualpar.pipeline.device_step.run_step`, every schedule)
runs the stages through its ``stage_forward`` hook.  Every device gets the batch's inputs (the
replay runs the glue code between calls on them), the last stage's devices the targets.
"""

from __future__ import annotations

import copy
import itertools
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from .. import nn
from ..errors import UsageError
from ..pipeline import build, lower, simulate, validate
from ..pipeline.device_step import run_step
from ..pipeline.executor import StepSpec
from ..pipeline.partition import forward_flops
from .trace import Trace, check_cuts, replay, trace_calls

__all__ = ["TracedPipeline", "TracedPipelineOperation"]

_IDS = itertools.count()


class TracedPipeline:
    """``model`` traced on ``example_inputs`` and cut into stages at ``cuts`` (names of calls, each the
    first call of a stage).  ``stage_params[s]``: the parameter names stage s reads."""

    def __init__(self, model: nn.Module, example_inputs: tuple, cuts: Sequence[str],
                 trace: Trace | None = None) -> None:
        if isinstance(cuts, str):
            raise UsageError(f"cuts must be a list of call names, got the string {cuts!r}")
        self.model = model
        self.trace = trace if trace is not None else trace_calls(model, *example_inputs)
        starts = [0] + [self.trace.index(c) for c in cuts]
        if starts != sorted(set(starts)):
            raise UsageError(f"cuts must follow the calls' order and be distinct, got {list(cuts)} (the "
                             f"calls: {self.trace.names()})")
        owner = check_cuts(self.trace, starts)
        self.starts = starts + [len(self.trace.calls)]
        self.cuts = list(cuts)
        order = list(model.state_dict())
        self.stage_params = [[k for k in order if owner.get(k) == s] for s in range(len(starts))]
        unused = [k for k in order if k not in owner]
        self.stage_params[0] += unused  # read by no call: kept (and left unchanged) by the first stage

    def __len__(self) -> int:
        return len(self.starts) - 1

    @classmethod
    def balanced(cls, model: nn.Module, example_inputs: tuple, stages: int, by: str = "params",
                 rows: int = 1) -> "TracedPipeline":
        """Cut into ``stages`` stages at the calls that can start one, minimising the heaviest stage
        (``by`` "params": parameters read; "flops": the called modules' forward FLOPs)."""
        if by not in ("params", "flops"):
            raise UsageError(f"balance by 'params' or 'flops', got {by!r}")
        tr = trace_calls(model, *example_inputs)
        sizes = {k: int(np.size(v)) for k, v in model.state_dict().items()}
        modules = dict(_named_modules(model))
        weight = [sum(sizes[p] for p in c.params) if by == "params" else forward_flops(modules[c.name], rows)
                  for c in tr.calls]
        n = len(weight)
        ok = [c for c in range(1, n) if _separable(tr, c)]
        if stages < 1 or stages - 1 > len(ok):
            raise UsageError(f"cannot cut the traced model into {stages} stages: it separates only at "
                             f"{[tr.calls[c].name for c in ok]}")
        prefix = np.concatenate([[0.0], np.cumsum(weight)])
        best: dict[tuple[int, int], tuple[float, list[int]]] = {(0, 1): (0.0, [])}
        points = [0] + ok
        for parts in range(1, stages):
            for i, a in enumerate(points):
                prev = best.get((a, parts))
                if prev is None:
                    continue
                for b in points[i + 1:]:
                    cand = (max(prev[0], prefix[b] - prefix[a]), prev[1] + [b])
                    if (b, parts + 1) not in best or cand[0] < best[(b, parts + 1)][0]:
                        best[(b, parts + 1)] = cand
        finals = [(max(v[0], prefix[n] - prefix[a]), v[1]) for (a, parts), v in best.items()
                  if parts == stages]
        _, cut_points = min(finals)
        return cls(model, example_inputs, [tr.calls[c].name for c in cut_points], trace=tr)


def _named_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    out, stack = [], [("", model)]
    while stack:
        prefix, mod = stack.pop()
        for name, child in mod.named_children():
            out.append((prefix + name, child))
            stack.append((prefix + name + ".", child))
    return out


def _separable(tr: Trace, c: int) -> bool:
    try:
        check_cuts(tr, [0, c])
    except UsageError:
        return False
    return True


def traced_stage_forward(step: Any, s: int, m: int, received: Any) -> tuple[Any, Any, float | None]:
    """The executor's hook for stage ``s`` of microbatch ``m``: replay the stage, and on the last
    stage add the loss."""
    st = step.st
    pipe: TracedPipeline = st["pipeline"]
    x = step.xs[m]
    last = s == len(pipe) - 1
    start, stop = pipe.starts[s], pipe.starts[s + 1]
    loss: Callable[[Any, Any], Any] = st["loss"]
    y = step.ys[m] if last else None

    def fn(params: dict, value: Any) -> Any:
        with pipe.model._bound(params):
            out = replay(pipe.model, pipe.trace, start, stop, (x,), value)
        return loss(out, y) if last else out

    rec = nn.vjp(fn, x if s == 0 else received, params=st["params"][s], input_grads=s > 0)
    return (rec, None, float(rec.output)) if last else (rec, rec.output, None)


def _place(dev: Any, key: str) -> None:
    init = dev.state.pop(key + "/init")
    dev.state[key] = {**init, "modules": {}, "staged": None, "update": None}


def _settle(st: dict, commit: bool) -> None:
    update, st["update"] = st.get("update"), None
    if update and commit:
        for s, (params, optimizer) in update.items():
            st["params"][s], st["optimizers"][s] = params, optimizer


def _step(dev: Any, key: str, rows: int, commit: bool) -> tuple[float | None, int, list]:
    st = dev.state[key]
    _settle(st, commit)
    loss, prank, records = run_step(dev, key, rows, False)
    grads, st["staged"] = st["staged"] or {}, None
    update = {}
    for s, g in grads.items():
        optimizer = copy.deepcopy(st["optimizers"][s])
        update[s] = (optimizer.step(st["params"][s], g), optimizer)
    st["update"] = update
    return loss, prank, records


def _fetch(dev: Any, key: str, commit: bool) -> dict[int, dict[str, np.ndarray]]:
    st = dev.state[key]
    _settle(st, commit)
    return dict(st["params"])


class TracedPipelineOperation:
    """One training step of a ``TracedPipeline`` on a cluster (every device a pipeline rank, or those of
    mesh ``axis``), under a named schedule; ``loss(output, target)``."""

    def __init__(self, pipeline: TracedPipeline, schedule: str, microbatches: int,
                 loss: Callable[[Any, Any], Any] = nn.mse_loss, optimizer: nn.Optimizer | None = None,
                 axis: Any = None) -> None:
        self.pipeline, self.schedule, self.microbatches = pipeline, schedule, microbatches
        self.loss, self.axis = loss, axis
        self.optimizer = optimizer if optimizer is not None else nn.SGD(0.1)
        self.key = f"traced/{next(_IDS)}"
        self._clusters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._staged: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _start(self, cluster: Any) -> StepSpec:
        mesh = cluster.mesh
        ranks = len(mesh.group_of(0, mesh.axes(self.axis)))
        stages = len(self.pipeline)
        if stages % ranks:
            raise UsageError(f"{stages} stages do not split over {ranks} pipeline ranks")
        schedule, placement = build(self.schedule, ranks, self.microbatches, stages // ranks)
        validate(schedule, placement, self.microbatches)
        simulate(schedule, placement, self.microbatches)
        spec = StepSpec(lower(schedule, placement), placement, self.microbatches, None, self.axis, None, None,
                        stage_forward=traced_stage_forward)
        full = self.pipeline.model.state_dict()
        for r in range(mesh.size):
            mine = placement.stages_of(mesh.group_of(r, mesh.axes(self.axis)).index(r))
            init = {"spec": spec, "pipeline": self.pipeline, "loss": self.loss,
                    "flops": {s: 0.0 for s in mine},
                    "params": {s: {k: full[k] for k in self.pipeline.stage_params[s]} for s in mine},
                    "optimizers": {s: copy.deepcopy(self.optimizer) for s in mine}}
            cluster.put(r, self.key + "/init", init)
        cluster.run(_place, self.key)
        return spec

    def execute_on(self, cluster: Any, x: Any, y: Any) -> float:
        x, y = np.asarray(x), np.asarray(y)
        if len(x) != len(y) or len(x) % self.microbatches:
            raise UsageError(f"x has {len(x)} rows and y {len(y)}: they must match and split into "
                             f"{self.microbatches} equal microbatches")
        spec = self._clusters.get(cluster)
        if spec is None:
            spec = self._clusters[cluster] = self._start(cluster)
        mesh, p = cluster.mesh, spec.placement
        last = p.rank_of(p.stages - 1, 0)
        for r in range(mesh.size):
            cluster.put(r, self.key + "/x", x, block=False)
            if mesh.group_of(r, mesh.axes(self.axis)).index(r) == last:
                cluster.put(r, self.key + "/y", y, block=False)
        commit = self._staged.pop(cluster, False)
        replies = cluster.run(_step, self.key, len(x), commit)
        self._staged[cluster] = True
        return float(np.mean([loss for loss, _, _ in replies if loss is not None]))

    def state_dict(self, cluster: Any) -> dict[str, np.ndarray]:
        """The trained weights, keyed like ``model.state_dict()``."""
        if cluster not in self._clusters:
            raise UsageError(f"{self.key!r} has not run on this cluster; run a step first")
        out: dict[str, np.ndarray] = {}
        for stages in cluster.run(_fetch, self.key, self._staged.pop(cluster, False)):
            for params in stages.values():
                for k, v in params.items():
                    out.setdefault(k, v)
        return {k: np.array(out[k], copy=True) for k in self.pipeline.model.state_dict()}
