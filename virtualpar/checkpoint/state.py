"""A training operation's state as the driver keeps it, and its conversion to and from checkpoint shards.

``TrainingState(step, stages)``: per stage (a pipeline stage; the one set of weights of a
replicated model is stage 0) its parameters under the stage's own names and its optimizer's
``{"t", "lr", "state"}``.  It is what a committed step leaves, what the driver keeps, what a
checkpoint shard holds and what is placed on a new cluster.

In a checkpoint every tensor is keyed by the *model's* name, independent of the layout:
``model/<name>`` for a parameter, ``optim/<name>/<slot>`` for an optimizer slot (momentum, Adam's
``m``/``v``/``step``); ``meta["optimizer"]`` keeps the optimizer's type, ``lr`` and step count
``t`` per shard.  A state saved under one cut of the layers is re-cut for another by key: each
target stage takes the model names it holds (``names``: stage -> {its name: model name}).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from .store import Checkpoint, CheckpointError

__all__ = ["StageState", "TrainingState", "to_shards", "from_checkpoint", "fork_optimizer", "optimizer_state"]


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


def to_shards(state: TrainingState, names: Mapping[int, Mapping[str, str]], shard: Callable[[int], str],
              optimizer: Any) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    """``state`` as checkpoint shards ({shard name: {key: array}}) and the index's meta."""
    shards: dict[str, dict[str, np.ndarray]] = {}
    ts: dict[str, int] = {}
    lr = float(optimizer.lr)
    for s, st in sorted(state.stages.items()):
        out = shards.setdefault(shard(s), {})
        for local, value in st.params.items():
            out[f"model/{names[s][local]}"] = np.asarray(value)
        for local, slots in st.optimizer["state"].items():
            for slot, value in slots.items():
                out[f"optim/{names[s][local]}/{slot}"] = np.asarray(value)
        ts[str(s)] = int(st.optimizer["t"])
        lr = float(st.optimizer["lr"])
    return shards, {"optimizer": {"type": type(optimizer).__name__, "lr": lr, "t": ts}}


def from_checkpoint(ckpt: Checkpoint, names: Mapping[int, Mapping[str, str]], model: Mapping[str, np.ndarray],
                    optimizer: Any) -> TrainingState:
    """The state for a layout whose stages hold ``names`` (stage -> {own name: model name}), from a
    checkpoint saved under any layout; ``model``: the model's own weights, to check names, shapes and
    dtypes against (no cast is made: a checkpoint of another dtype is refused)."""
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
        for local, name in own.items():
            value = ckpt.tensor(f"model/{name}")
            want = np.asarray(model[name])
            if value.shape != want.shape or value.dtype != want.dtype:
                raise CheckpointError(f"checkpoint {ckpt.path}: {name!r} is {value.dtype} {value.shape}, the "
                                      f"model's {want.dtype} {want.shape}")
            params[local] = value
            if name in slots:
                state[local] = {slot: ckpt.tensor(k) for slot, k in slots[name]}
        stages[s] = StageState(params, {"t": t, "lr": lr, "state": state})
    return TrainingState(ckpt.step, stages)
