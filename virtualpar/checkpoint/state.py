"""A training operation's state as the driver keeps it, and its conversion to and from checkpoint shards.

``TrainingState(step, stages)``: per stage (a pipeline stage; the one set of weights of a
replicated model is stage 0) its parameters under the stage's own names and its optimizer's
``{"t", "lr", "state"}``.  It is what a committed step leaves, what the driver keeps, what a
checkpoint shard holds and what is placed on a new cluster.

In a checkpoint every tensor is keyed by the *model's* name, independent of the layout:
``model/<name>`` for a parameter, ``optim/<name>/<slot>`` for an optimizer slot (momentum, Adam's
``m``/``v``/``step``); ``meta["optimizer"]`` keeps the optimizer's type, ``lr`` and step count
``t`` per shard.  A state saved under one cut of the layers is re-cut for another by key: each
target stage takes the model names it holds (``names``: stage -> {its name: model name}).  A
stage may hold a part of a tensor — ``(model name, index)``, e.g. a tensor-parallel column block
``(name, (slice(None), slice(0, 4)))`` — and is then saved as that piece of the tensor
(:mod:`.tiles`) and loaded by cutting the assembled tensor, so tp, dp and ZeRO layouts re-cut the
same way as pipeline stages.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Tuple, Union

import numpy as np

from .store import Checkpoint, CheckpointError
from .tiles import Piece

__all__ = ["Name", "StageState", "TrainingState", "to_shards", "from_checkpoint", "fork_optimizer",
           "optimizer_state"]


@dataclass(frozen=True)
class StageState:
    """A stage's parameters (its own names) and optimizer state ``{"t", "lr", "state": {name: {slot: ...}}}``
    (``t`` its steps, ``state`` its arrays per parameter: momentum, Adam's m, v and step)."""

    params: dict[str, np.ndarray]
    optimizer: dict[str, Any]


@dataclass(frozen=True)
class TrainingState:
    """The committed state of a training operation after ``step`` optimizer steps."""

    step: int
    stages: dict[int, StageState] = field(default_factory=dict)


def optimizer_state(opt: Any) -> dict[str, Any]:
    """``opt``'s state without copying its arrays (they are shipped, or were replaced by the step)."""
    return {"t": int(opt.t), "lr": float(opt.lr), "state": {k: dict(v) for k, v in opt.state.items()}}


def fork_optimizer(opt: Any) -> Any:
    """A copy of ``opt`` that can take a step without changing ``opt``: its state dicts are new, its
    arrays shared — the optimizers of :mod:`virtualpar.nn.optim` replace their state arrays on a step
    (``m ← β1·m + ...`` makes a new array) rather than writing into them, so sharing costs no copy."""
    new = copy.copy(opt)
    new.state = {k: dict(v) for k, v in opt.state.items()}
    return new


Name = Union[str, Tuple[str, Tuple[slice, ...]]]  # a model name, or (model name, the part of it held)


def _split(spec: Name) -> tuple[str, tuple[slice, ...] | None]:
    return (spec, None) if isinstance(spec, str) else (spec[0], tuple(spec[1]))


def _part(a: np.ndarray, index: tuple[slice, ...] | None, full: tuple[int, ...]) -> Piece:
    """``a`` as the piece ``index`` of a tensor of shape ``full`` — or whole, when it has the full
    shape or none of it (a 0-d slot, e.g. Adam's step count, kept whole by every holder)."""
    if index is None or a.shape == full or a.ndim != len(full):
        return Piece(a)
    return Piece(a, tuple(sl.indices(n)[0] for sl, n in zip(index, full)), full)


def _cut(a: np.ndarray, index: tuple[slice, ...] | None, full: tuple[int, ...]) -> np.ndarray:
    """The part ``index`` of a tensor of shape ``full`` (a slot of another shape is kept whole)."""
    return a if index is None or a.shape != full else a[index].copy()


def to_shards(state: TrainingState, names: Mapping[int, Mapping[str, Name]], shard: Callable[[int], str],
              optimizer: Any, shapes: Mapping[str, tuple[int, ...]] | None = None
              ) -> tuple[dict[str, dict[str, Piece]], dict[str, Any]]:
    """``state`` as checkpoint shards ({shard name: {key: piece}}) and the index's meta.  A name given
    as ``(model name, index)`` is a part of the model's tensor (``shapes`` gives the full shapes):
    its weights and same-shaped optimizer slots are written as that piece.  A piece several stages
    hold alike (data-parallel replicas, a scalar slot) is written once, by the first."""
    shards: dict[str, dict[str, Piece]] = {}
    written: set[tuple[str, tuple[int, ...]]] = set()
    ts: dict[str, int] = {}
    lr = float(optimizer.lr)

    def put(out: dict, key: str, value: Any, index: tuple[slice, ...] | None, full: tuple[int, ...]) -> None:
        piece = _part(np.asarray(value), index, full)
        if (key, piece.start) not in written:
            written.add((key, piece.start))
            out[key] = piece

    for s, st in sorted(state.stages.items()):
        out = shards.setdefault(shard(s), {})
        for local, value in st.params.items():
            name, index = _split(names[s][local])
            full = tuple(shapes[name]) if index is not None and shapes is not None else np.shape(value)
            put(out, f"model/{name}", value, index, full)
            for slot, v in st.optimizer["state"].get(local, {}).items():
                put(out, f"optim/{name}/{slot}", v, index, full)
        ts[str(s)] = int(st.optimizer["t"])
        lr = float(st.optimizer["lr"])
    return shards, {"optimizer": {"type": type(optimizer).__name__, "lr": lr, "t": ts}}


def from_checkpoint(ckpt: Checkpoint, names: Mapping[int, Mapping[str, Name]],
                    model: Mapping[str, np.ndarray], optimizer: Any) -> TrainingState:
    """The state for a layout whose stages hold ``names`` (stage -> {own name: model name, or (model
    name, index) for a part of it}), from a checkpoint saved under any layout: each tensor assembled
    whole, then cut as the target holds it; ``model``: the model's own weights, to check names,
    shapes and dtypes against (no cast is made: a checkpoint of another dtype is refused)."""
    saved = {k[len("model/"):] for k in ckpt.keys() if k.startswith("model/")}
    missing, extra = sorted(set(model) - saved), sorted(saved - set(model))
    if missing or extra:
        raise CheckpointError(f"checkpoint {ckpt.path} does not fit this model: "
                              + "; ".join(s for s in (f"missing {missing[:6]}" if missing else "",
                                                      f"not in the model {extra[:6]}" if extra else "") if s))
    opt = ckpt.meta.get("optimizer", {})
    if opt.get("type") != type(optimizer).__name__:
        raise CheckpointError(f"checkpoint {ckpt.path} holds {opt.get('type')!r} optimizer state; the "
                              f"operation's optimizer is {type(optimizer).__name__}")
    ts = set(opt.get("t", {}).values())
    if len(ts) != 1:
        raise CheckpointError(f"checkpoint {ckpt.path}: its shards' optimizers took different numbers of "
                              f"steps {opt.get('t')}; they cannot be re-cut into other stages")
    t, lr = ts.pop(), float(opt["lr"])
    slots: dict[str, list[tuple[str, str]]] = {}
    for k in ckpt.keys():
        if k.startswith("optim/"):
            name, _, slot = k[len("optim/"):].rpartition("/")
            slots.setdefault(name, []).append((slot, k))
    stages = {}
    for s, own in names.items():
        params, state = {}, {}
        for local, spec in own.items():
            name, index = _split(spec)
            value = ckpt.tensor(f"model/{name}")
            want = np.asarray(model[name])
            if value.shape != want.shape or value.dtype != want.dtype:
                raise CheckpointError(f"checkpoint {ckpt.path}: {name!r} is {value.dtype} {value.shape}, the "
                                      f"model's {want.dtype} {want.shape}")
            params[local] = _cut(value, index, want.shape)
            if name in slots:
                state[local] = {slot: _cut(ckpt.tensor(k), index, want.shape) for slot, k in slots[name]}
        stages[s] = StageState(params, {"t": t, "lr": lr, "state": state})
    return TrainingState(ckpt.step, stages)
