"""A pipeline of any ``nn.Module``, cut at named calls of its traced forward (NeuronX-style partitioning).

    pipe = Pipeline(gpt, cuts=["blocks.2"])                  # an nn.GPT traces itself on (1, seq_len) tokens
    pipe = Pipeline(model, cuts=["l3"], example_inputs=(x[:2],))
    pipe = Pipeline.balanced(gpt, 4)                         # the cut points the trace can separate
    op = PipelinedOperation(pipe, "1f1b", microbatches=4, loss=nn.cross_entropy, optimizer=nn.AdamW())

``Pipeline(model, ...)`` of a model that is not an ``nn.Sequential`` builds a :class:`TracedPipeline`:
the model is traced once (:mod:`.trace`), the cuts are checked (refused naming the modules when the
trace cannot separate them), and each stage is a :class:`TracedStage` — a module whose parameters
are the stage's, under the whole model's names, and whose forward replays the model's own
``forward`` over the stage's calls.  The one executor runs those stages as it runs a Sequential's.

Cost: a stage's replay runs the model's glue code between calls (on placeholders before the
stage, cheap) and its calls; every device holds the model object (the stages' parameters it keeps
are its own copies).  The modelled FLOPs of a stage are its called modules'
(:func:`.partition.forward_flops`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import nn
from ..errors import UsageError
from .partition import TRACED, Pipeline, PipelineStage, action_flops, forward_flops
from .trace import Trace, check_cuts, placeholders, replay, trace_calls

__all__ = ["TracedStage", "TracedPipeline", "default_inputs", "named_modules"]


def default_inputs(model: nn.Module) -> tuple:
    """Example inputs for tracing a model that knows its input: a GPT's (1, seq_len) tokens."""
    if isinstance(model, nn.GPT):
        return (np.zeros((1, model.seq_len), np.int64),)
    raise UsageError(f"Pipeline: cutting a {type(model).__name__} (not an nn.Sequential) traces its forward "
                     f"once, which needs example inputs: "
                     f"Pipeline(model, cuts=[...], example_inputs=(x[:1],))")


def named_modules(model: nn.Module) -> dict[str, nn.Module]:
    out, stack = {}, [("", model)]
    while stack:
        prefix, mod = stack.pop()
        for name, child in mod.named_children():
            out[prefix + name] = child
            stack.append((prefix + name + ".", child))
    return out


class TracedStage(nn.Module):
    """Calls ``start … stop−1`` of ``model``'s traced forward as a module.  Its parameters are the
    stage's ``names`` (the whole model's keys); ``forward(x)``: the model's inputs on the first stage,
    the previous stage's output on the others (replayed on placeholder inputs)."""

    def __init__(self, model: nn.Module, trace: Trace, start: int, stop: int, names: Sequence[str],
                 example: tuple) -> None:
        # set past Module.__setattr__: the model is not a child, only the stage's parameters are ours
        for k, v in (("_model", model), ("_trace", trace), ("_start", start), ("_stop", stop),
                     ("_names", frozenset(names)), ("_example", example)):
            object.__setattr__(self, k, v)

    def _slots(self, prefix: str = "", path: tuple = ()) -> Any:
        for dotted, owner, leaf, value in self._model._slots(prefix, path + (self,)):
            if dotted[len(prefix):] in self._names:
                yield dotted, owner, leaf, value

    def forward(self, x: Any) -> Any:
        if self._start == 0:
            return replay(self._model, self._trace, 0, self._stop, (x,), None)
        inputs = placeholders(self._example, int(np.shape(x)[0]))
        return replay(self._model, self._trace, self._start, self._stop, inputs, x)

    def action_flops(self, rows: int) -> dict[str, float]:
        """FLOPs of ``rows`` rows per compute action (F, I, W, B): the sums of what the stage's called
        modules declare (:func:`.partition.action_flops`)."""
        modules = named_modules(self._model)
        total = {"F": 0.0, "I": 0.0, "W": 0.0, "B": 0.0}
        for call in self._trace.calls[self._start:self._stop]:
            for kind, value in action_flops(modules[call.name], rows).items():
                total[kind] += value
        return total

    def forward_flops(self, rows: int) -> float:
        """Forward FLOPs of ``rows`` rows (:meth:`action_flops`'s ``F``)."""
        return self.action_flops(rows)["F"]

    def extra_repr(self) -> str:
        calls = self._trace.calls
        return f"calls {calls[self._start].name} … {calls[self._stop - 1].name}"


def _separable(tr: Trace, c: int) -> bool:
    try:
        check_cuts(tr, [0, c])
    except UsageError:
        return False
    return True


class TracedPipeline(Pipeline):
    """``model`` (any ``nn.Module``) traced on ``example_inputs`` and cut at ``cuts``: names of calls,
    each the first call of a stage.  ``stage_params[s]``: the parameter names stage s reads;
    ``stages``: :class:`.partition.PipelineStage` of :class:`TracedStage` modules.  Built by
    ``Pipeline(model, cuts)`` for a model that is not an ``nn.Sequential``."""

    def __init__(self, model: nn.Module, cuts: Sequence[str], example_inputs: tuple | None = None,
                 trace: Trace | None = None) -> None:
        if isinstance(cuts, (str, bytes)) or not hasattr(cuts, "__iter__"):
            raise UsageError(f"cuts must be a list of call names such as ['blocks.2'], got {cuts!r}")
        if example_inputs is None:
            example_inputs = default_inputs(model)
        elif not isinstance(example_inputs, tuple):
            example_inputs = (example_inputs,)
        self.model, self.example_inputs = model, example_inputs
        self.trace = trace if trace is not None else trace_calls(model, *example_inputs)
        cuts = list(cuts)
        if not all(isinstance(c, str) for c in cuts):
            raise UsageError(f"cuts of a traced model are call names, one of {self.trace.names()[1:]}; "
                             f"got {cuts}")
        starts = [0] + [self.trace.index(c) for c in cuts]
        if starts != sorted(set(starts)):
            raise UsageError(f"cuts must follow the calls' order and be distinct, got {cuts} (the calls: "
                             f"{self.trace.names()})")
        owner = check_cuts(self.trace, starts)
        self.starts = starts + [len(self.trace.calls)]
        self.cuts = cuts
        order = list(model.state_dict())
        self.stage_params = [[k for k in order if owner.get(k) == s] for s in range(len(starts))]
        self.stage_params[0] += [k for k in order if k not in owner]  # read by no call: kept by stage 0
        bounds = zip(self.starts[:-1], self.starts[1:])
        self.stages = [PipelineStage(s, TracedStage(model, self.trace, a, b, self.stage_params[s],
                                                    example_inputs), a) for s, (a, b) in enumerate(bounds)]

    def __len__(self) -> int:
        return len(self.starts) - 1

    @classmethod
    def balanced(cls, model: nn.Module, stages: int, by: str = "params", rows: int = 1,
                 example_inputs: tuple | None = None) -> "TracedPipeline":
        """Cut into ``stages`` stages at the calls that can start one, minimising the heaviest stage
        (``by`` "params": parameters read; "flops": the called modules' forward FLOPs); exact, by
        dynamic programming over the separable cut points."""
        if by not in ("params", "flops"):
            raise UsageError(f"balance by 'params' or 'flops', got {by!r}")
        if example_inputs is None:
            example_inputs = default_inputs(model)
        elif not isinstance(example_inputs, tuple):
            example_inputs = (example_inputs,)
        tr = trace_calls(model, *example_inputs)
        sizes = {k: int(np.size(v)) for k, v in model.state_dict().items()}
        modules = named_modules(model)
        weight = [sum(sizes[p] for p in c.params) if by == "params" else forward_flops(modules[c.name], rows)
                  for c in tr.calls]
        n = len(weight)
        ok = [c for c in range(1, n) if _separable(tr, c)]
        whole = isinstance(stages, (int, np.integer)) and not isinstance(stages, bool)
        if not whole or not 0 < stages <= len(ok) + 1:
            raise UsageError(f"cannot cut the traced model into {stages!r} stages: it separates only at "
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
        return cls(model, [tr.calls[c].name for c in cut_points], example_inputs, trace=tr)


TRACED["pipeline"] = TracedPipeline
