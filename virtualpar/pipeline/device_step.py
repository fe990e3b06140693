"""The device side of a pipelined step: one interpreter for every schedule.

``run_step(dev, key)`` runs this device's lowered action list through ``HANDLERS`` — a table keyed
by action kind that rejects anything else — so GPipe, 1F1B, interleaved, zero-bubble and the
unified strategies all execute here and nowhere else.  It uses the device only through the
device protocol (``group``, ``group_rank``, ``isend``, ``recv``, ``all_reduce``, ``compute``,
``clock``, ``state``), so it also runs under the MPI backend.

Gradients of the mean loss: the last stage seeds each microbatch's backward with 1/M, so the
sum over microbatches accumulated per stage is the mean, as :func:`virtualpar.nn.reference_train`
takes it; a data-parallel axis then averages over its replicas.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from .. import nn
from ..errors import UsageError
from .actions import Action, ActionRecord
from .step_state import StepState, declared_flops

__all__ = ["run_step", "HANDLERS", "PipelineError", "declared_flops"]


class PipelineError(UsageError):
    """A pipeline step cannot go on (e.g. an activation of the wrong shape between two stages)."""


def _forward(c: StepState, a: Action) -> None:
    s, _, m = a
    if c.spec.stage_forward is not None:  # another stage program (timeline parallelism)
        received = None if s == 0 else c.inbox.pop(("F", s, m))
        rec, out, loss = c.spec.stage_forward(c, s, m, received)
        if loss is not None:
            c.losses[m] = loss
        else:
            c.deliver("F", s, m, out)
        c.stash[(s, m)] = rec
        c.charge("F", s)
        return
    module, params = c.st["modules"][s], c.params(s, m)
    x = c.xs[m] if s == 0 else c.inbox.pop(("F", s, m))
    try:
        data = s == 0  # the first stage's input is the batch: no gradient for it
        if s == c.spec.placement.stages - 1:
            y, loss = c.ys[m], c.spec.loss
            rec = nn.vjp(lambda p, inp: loss(nn.functional_call(module, p, inp), y), x, params=params,
                         input_grads=not data)
            c.losses[m] = float(rec.output)
        else:
            rec = nn.vjp(module, x, params=params, input_grads=not data)
            c.deliver("F", s, m, rec.output)
    except nn.ShapeError as exc:
        src = f"stage {s - 1}'s activation" if s else "the input batch"
        raise PipelineError(
            f"stage {s} (pipeline rank {c.where(s, m)}) cannot take {src} of shape {np.shape(x)} "
            f"(microbatch {m}): {exc}"
        ) from None
    c.stash[(s, m)] = rec
    c.charge("F", s)


def _seed(c: StepState, s: int, m: int) -> Any:
    if s == c.spec.placement.stages - 1:
        return 1.0 / c.spec.microbatches
    return c.inbox.pop(("B", s, m))


def _backward(c: StepState, a: Action) -> None:
    s, _, m = a
    if not c.holds(s):
        c.inbox.pop(("W", s, m))  # fetched as FSDP does; the recorded forward already holds them
    dx, g = c.stash.pop((s, m)).backward(_seed(c, s, m))
    c.accumulate(s, g, m)
    if s > 0:
        c.deliver("B", s, m, dx)
    _charge_grads(c, "B", s, m)


def _charge_grads(c: StepState, kind: str, s: int, m: int) -> None:
    """Charge a backward that produced gradients, then tell the spec's ``on_grads`` hook when it ran."""
    start = c.dev.clock
    c.charge(kind, s)
    if c.spec.on_grads is not None:
        c.spec.on_grads(c, kind, s, m, start, c.dev.clock)


def _backward_input(c: StepState, a: Action) -> None:
    s, _, m = a
    dx = c.stash[(s, m)].backward_input(_seed(c, s, m))
    if s > 0:
        c.deliver("B", s, m, dx)
    c.charge("I", s)


def _backward_weight(c: StepState, a: Action) -> None:
    s, _, m = a
    c.accumulate(s, c.stash.pop((s, m)).backward_weight(), m)
    _charge_grads(c, "W", s, m)


def _send(kind: str) -> Callable[[StepState, Action], None]:
    def send(c: StepState, a: Action) -> None:
        s, _, m = a
        if kind == "W":  # this rank keeps the stage's weights: send them to the computing rank
            value, to = c.st["params"][s], c.peer(s, m)
        elif kind == "G":  # a gradient computed here goes back to the rank keeping the weights
            value, to = c.outbox.pop(("G", s, m)), c.group[c.spec.placement.weight_rank(s)]
        else:
            value, to = c.outbox.pop((kind, s, m)), c.peer(s + 1 if kind == "F" else s - 1, m)
        if isinstance(value, np.ndarray):
            value = np.ascontiguousarray(value)  # arrays travel raw; tuples and dicts are pickled
        c.sends.append(c.dev.isend(value, to, tag=c.tag(kind, s, m)))
    return send


def _recv(kind: str) -> Callable[[StepState, Action], None]:
    def recv(c: StepState, a: Action) -> None:
        s, _, m = a
        if kind == "W":
            c.inbox[("W", s, m)] = c.dev.recv(c.group[c.spec.placement.weight_rank(s)], tag=c.tag("W", s, m))
        elif kind == "G":
            c.accumulate(s, c.dev.recv(c.peer(s, m), tag=c.tag("G", s, m)))
        else:
            src = s - 1 if kind == "F" else s + 1
            c.inbox[(kind, s, m)] = c.dev.recv(c.peer(src, m), tag=c.tag(kind, src, m))
    return recv


HANDLERS: dict[str, Callable[[StepState, Action], None]] = {
    "F": _forward, "B": _backward, "I": _backward_input, "W": _backward_weight,
    "SF": _send("F"), "RF": _recv("F"), "SB": _send("B"), "RB": _recv("B"),
    "SW": _send("W"), "RW": _recv("W"), "SG": _send("G"), "RG": _recv("G"),
}


def _sum_copies(c: StepState, stage: int, ranks: tuple[int, ...], grads: dict) -> dict:
    """Sum a replicated stage's gradients over the ranks keeping a copy: each sends its part to the
    first of them, which adds them in rank order (the same bits for everyone) and sends the sum
    back.  Point to point, because the copies need not form a mesh axis (looped pipelines)."""
    lead = c.group[ranks[0]]
    tag = 1 + 4 * c.spec.placement.stages * c.spec.microbatches + 2 * stage
    if c.me != ranks[0]:
        c.dev.send(grads, lead, tag=tag)
        return c.dev.recv(lead, tag=tag + 1)
    total = {k: np.array(v, copy=True) for k, v in grads.items()}
    for r in ranks[1:]:
        part = c.dev.recv(c.group[r], tag=tag)
        for k in total:
            total[k] += part[k]
    for r in ranks[1:]:
        c.dev.send(total, c.group[r], tag=tag + 1)
    return total


def settle(st: dict, commit: bool) -> None:
    """Apply the optimizer steps a previous step staged (``commit``: it succeeded on every device),
    or drop them.  A step stages rather than applies its update because a device cannot know
    whether another failed after it finished: applied at once, a failure elsewhere left some
    stages updated and others not (and data-parallel copies apart)."""
    staged, st["staged"] = st.get("staged"), None
    if staged and commit:
        for s, grads in staged.items():
            st["params"][s] = st["optimizers"][s].step(st["params"][s], grads)


def run_step(dev: Any, key: str, rows: int | None = None, commit: bool = False
             ) -> tuple[float | None, int, list[ActionRecord]]:
    """One training step of the pipelined operation stored under ``dev.state[key]``; returns
    (the mean microbatch loss on a last-stage device, else None; this device's pipeline rank;
    (action, wall start, wall end, modelled start, modelled end) per action run).  ``rows``: the
    rows of this replica's batch, which a stage's modelled FLOPs scale with (the devices holding
    the batch or the targets know it; the stages between them learn it here).  ``commit``: the
    previous step succeeded everywhere, so its staged update is applied first (see :func:`settle`)."""
    st = dev.state[key]
    settle(st, commit)
    spec = st["spec"]
    c = StepState(dev, st, dev.state.pop(key + "/x", None), dev.state.pop(key + "/y", None), rows)
    prank = c.me
    for a in spec.lowered[prank]:
        handler = HANDLERS.get(a.kind)
        if handler is None:
            raise PipelineError(f"unknown action kind {a.kind!r} in {a}; known kinds: {', '.join(HANDLERS)}")
        w0, m0 = time.monotonic(), dev.clock
        handler(c, a)
        c.records.append(ActionRecord(a, w0, time.monotonic(), m0, dev.clock))
    for req in c.sends:
        req.wait()
    copies = spec.placement.copies
    for s, ranks in copies.items():  # every copy joins the sum, with zeros if it computed nothing
        if c.me in ranks and s not in c.grads:
            c.grads[s] = {k: np.zeros_like(v) for k, v in st["params"][s].items()}
    final = {}
    for s in sorted(c.grads):
        grads = c.grads[s]
        if s in copies:
            grads = _sum_copies(c, s, copies[s], grads)
        if spec.shared_axis is not None:  # one set of weights used by every stage: add their parts
            grads = {k: dev.all_reduce(v, group=spec.shared_axis) for k, v in grads.items()}
        if spec.dp_axis is not None:
            grads = {k: dev.all_reduce(v, op="avg", group=spec.dp_axis) for k, v in grads.items()}
        final[s] = grads
    st["staged"] = (
        final  # applied by the next step or weight fetch, once the driver knows every device succeeded
    )
    loss = float(np.mean([c.losses[m] for m in sorted(c.losses)])) if c.losses else None
    if loss is not None and spec.dp_axis is not None:
        loss = float(dev.all_reduce(np.array([loss]), op="avg", group=spec.dp_axis)[0])
    return loss, prank, c.records
