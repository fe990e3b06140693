"""``Pipeline`` and ``PipelineStage``: a model cut into stages.

An ``nn.Sequential`` is cut at points the user names — layer names (``"3"``) or indices: a cut at
``c`` starts a new stage at layer ``c`` — or automatically, balanced by parameter count or by
forward FLOPs: the split into S contiguous parts minimising the heaviest part (exact, by dynamic
programming over the layer weights).  Any other ``nn.Module`` (a GPT whose blocks live in a list,
a model with its own ``forward``) is traced once and cut at named calls: ``Pipeline(model,
cuts=["blocks.2"])`` builds a :class:`~.traced.TracedPipeline` (see :mod:`.traced`), and
``Pipeline.balanced`` balances it the same way over the calls the trace can separate.
"""

from __future__ import annotations

import numbers

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import nn
from ..errors import UsageError

__all__ = ["Pipeline", "PipelineStage"]


@dataclass(frozen=True)
class PipelineStage:
    """Stage ``index`` of a ``Pipeline``: ``module``, the model's layers from ``first_layer`` (the index of
    its first layer in the whole model) up to the next cut, as an ``nn.Sequential``."""

    index: int
    module: nn.Sequential
    first_layer: int  # index of its first layer in the whole model

    def parameters(self) -> dict[str, np.ndarray]:
        """This stage's parameters keyed as in the *whole* model's ``state_dict()``."""
        if not isinstance(self.module, nn.Sequential):  # a traced stage: already the model's names
            return self.module.parameters()
        return {_global(k, self.first_layer): v for k, v in self.module.parameters().items()}

    def flops(self, rows: int) -> float:
        """Forward FLOPs of ``rows`` rows through the stage (see :func:`forward_flops`)."""
        return forward_flops(self.module, rows)

    def action_flops(self, rows: int) -> dict[str, float]:
        """FLOPs of ``rows`` rows per compute action of the stage (see :func:`action_flops`)."""
        return action_flops(self.module, rows)

    def input_features(self) -> int | None:
        first = next(iter(self.module), None)
        return getattr(first, "in_features", None)


def action_flops(module: nn.Module, rows: int, path: tuple = ()) -> dict[str, float]:
    """FLOPs of ``rows`` rows through ``module`` per compute action, as its layers declare them:
    ``F`` the forward, ``I`` the backward's input part (dx), ``W`` its weight part (dW), and ``B``
    = ``I + W``.  A ``Linear`` declares ``flops(rows)`` and ``backward_flops(rows)`` (one
    ``kernels.matmul_flops`` each); an ``Embedding`` is a lookup (0); any other layer holding
    parameters itself (a norm, a recurrent cell) costs 2·rows per parameter in each of F, I and W,
    one multiply-add each — for a recurrent layer one time step per row.  Layers without
    parameters cost nothing here.  Nested modules are summed at any depth; a module that counts its
    own (a traced stage: ``action_flops(rows)``) is asked."""
    own_count = getattr(module, "action_flops", None)
    if callable(own_count):
        return dict(own_count(rows))
    if isinstance(module, nn.Linear):
        dx, dw = module.backward_flops(rows)
        return {"F": float(module.flops(rows)), "I": dx, "W": dw, "B": dx + dw}
    if isinstance(module, nn.Embedding):
        return {"F": 0.0, "I": 0.0, "W": 0.0, "B": 0.0}
    children = [c for _, c in module.named_children() if not any(c is p for p in path)]
    own = sum(int(np.size(v)) for k, v in vars(module).items()
              if isinstance(v, np.ndarray) and k in module.__dict__.get("_order", ()))
    total = {"F": 2.0 * rows * own, "I": 2.0 * rows * own, "W": 2.0 * rows * own}
    for c in children:
        part = action_flops(c, rows, path + (module,))
        for kind in total:
            total[kind] += part[kind]
    return {**total, "B": total["I"] + total["W"]}


def forward_flops(module: nn.Module, rows: int, path: tuple = ()) -> float:
    """Forward FLOPs of ``rows`` rows through ``module`` (:func:`action_flops`'s ``F``)."""
    return action_flops(module, rows, path)["F"]


#: how a model that is not an ``nn.Sequential`` is cut: ``TRACED["pipeline"]`` is
#: :class:`~.traced.TracedPipeline`, entered by :mod:`.traced` (which the package imports), so this
#: module does not import the one that builds on it
TRACED: dict[str, type] = {}


def _traced() -> type:
    if "pipeline" not in TRACED:  # pragma: no cover - the package's __init__ imports .traced
        raise UsageError("cutting a model that is not an nn.Sequential needs virtualpar.pipeline.traced")
    return TRACED["pipeline"]


def _global(local: str, offset: int) -> str:
    head, _, rest = local.partition(".")
    return f"{int(head) + offset}.{rest}"


class Pipeline:
    """``model`` cut into stages; ``Pipeline(model, cuts=[2, 4])`` or ``Pipeline.balanced(model, 4)``.
    A model that is not an ``nn.Sequential`` is traced (``example_inputs``: its inputs for one
    forward; a GPT's are made up) and cut at named calls: a :class:`~.traced.TracedPipeline`."""

    def __new__(cls, model: Any = None, *args: Any, **kwargs: Any) -> "Pipeline":
        if cls is Pipeline and isinstance(model, nn.Module) and not isinstance(model, nn.Sequential):
            return super().__new__(_traced())
        return super().__new__(cls)

    def __init__(self, model: nn.Sequential, cuts: Sequence[int | str], example_inputs: Any = None) -> None:
        if not isinstance(model, nn.Sequential):
            raise UsageError(f"Pipeline needs an nn.Module (an nn.Sequential is cut by layer, any other "
                             f"module at named calls of its traced forward), got {type(model).__name__}")
        n = len(model)
        names = [str(i) for i in range(n)]
        points = []
        if isinstance(cuts, (str, bytes)) or not hasattr(cuts, "__iter__"):
            raise UsageError(f"cuts must be a list of cut points (layer indices or names), got {cuts!r}")
        for c in cuts:
            i = names.index(c) if isinstance(c, str) and c in names else c
            if isinstance(i, numbers.Integral) and not isinstance(i, bool):  # numpy's integers too
                i = int(i)
            if not isinstance(i, int) or isinstance(i, bool) or not 0 < i < n:
                raise UsageError(
                    f"no cut point {c!r} in this model; valid cut points are the layers {names[1:]} "
                    f"(a cut at c starts a new stage at layer c)"
                )
            points.append(i)
        if points != sorted(set(points)):
            raise UsageError(f"cut points must be increasing and distinct, got {list(cuts)}")
        bounds = [0, *points, n]
        self.model = model
        self.stages = [
            PipelineStage(i, model[a:b], a) for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))
        ]

    @classmethod
    def balanced(cls, model: nn.Sequential, stages: int, by: str = "params", rows: int = 1,
                 example_inputs: Any = None) -> "Pipeline":
        """Cut into ``stages`` contiguous parts minimising the heaviest (``by`` "params" or "flops");
        a model that is not an ``nn.Sequential`` is traced and cut at the calls that can start a stage."""
        if isinstance(model, nn.Module) and not isinstance(model, nn.Sequential):
            return _traced().balanced(model, stages, by, rows, example_inputs)
        if by not in ("params", "flops"):
            raise UsageError(f"balance by 'params' or 'flops', got {by!r}")
        if isinstance(stages, bool) or not isinstance(stages, numbers.Integral):
            raise UsageError(f"stages must be an int, got {stages!r}")
        weights = [
            layer.num_parameters() if by == "params" else forward_flops(layer, rows) for layer in model
        ]
        n = len(weights)
        if not 1 <= stages <= n:
            raise UsageError(f"cannot cut {n} layers into {stages} non-empty stages")
        prefix = np.concatenate([[0.0], np.cumsum(weights)])
        best = {(0, 0): (0.0, [])}  # (layers used, parts) -> (heaviest part, cuts)
        for parts in range(1, stages + 1):
            for end in range(parts, n - (stages - parts) + 1):
                options = []
                for start in range(parts - 1, end):
                    prev = best.get((start, parts - 1))
                    if prev is not None:
                        options.append(
                            (max(prev[0], prefix[end] - prefix[start]), prev[1] + ([start] if start else []))
                        )
                best[(end, parts)] = min(options, key=lambda o: (o[0], o[1]))
        return cls(model, best[(n, stages)][1])

    def __len__(self) -> int:
        return len(self.stages)
