"""A pipeline stage of the GPT on one device: the program the one pipeline executor runs for F, B, I, W.

:func:`stage_forward` is the executor's ``stage_forward`` hook (``StepSpec.stage_forward``): for
stage s and microbatch m it runs the stage's units — embeddings on the first stage, its blocks,
the head and the loss on the last — on this device's shards, records the trace with
:func:`virtualpar.nn.vjp`, and returns (the record, the activation to send on, the loss).  The
executor's schedules, p2p and gradient accumulation do the rest; what travels between stages is
the (tp/SP/cp-sharded) activation this device holds.

Parameters arrive as one flat vector per unit (:mod:`.layout`); under ZeRO-3 a flat vector is this
device's 1/dp shard, all-gathered over dp where the unit runs, freed after its forward and gathered
again for its backward, whose gradient is reduce-scattered (FSDP, :mod:`.fsdp`; Rajbhandari et al.
2020).  A recomputed block gathers inside :func:`checkpoint` (the differentiable all_gather), so
its forward and its recomputation each gather once and nothing gathered is kept either.

``recompute``: each block runs inside :func:`checkpoint`, whose forward keeps only its input and
whose backward runs the block's forward again (Chen et al. 2016; Korthikanti et al. 2022's "full"
recomputation), collectives included.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from autograd.extend import defvjp_argnums, primitive

from .. import nn
from ..tensor_parallel import autodiff as ad
from .layers import Ctx, block, embed, final_loss
from .flat import unit_params
from .fsdp import Gatherer, fsdp_unit
from .memory import Tracked, saved_bytes

__all__ = ["stage_forward", "checkpoint"]


@primitive
def checkpoint(x: np.ndarray, flat: np.ndarray, fn: Callable[[Any, Any], Any],
               charge: Callable[[], None] = lambda: None) -> np.ndarray:
    """``fn(x, flat)``, keeping nothing of its inside for the backward, which recomputes it (and
    calls ``charge()`` to put the repeated forward on the modelled clock)."""
    return fn(x, flat)


def _recompute(argnums: tuple[int, ...], ans: Any, args: tuple, kwargs: dict) -> Callable[[Any], tuple]:
    x, flat, fn = args[:3]
    charge = args[3] if len(args) > 3 else kwargs.get("charge", lambda: None)

    def vjp(g: Any) -> tuple:
        charge()
        rec = nn.vjp(lambda p, xx: fn(xx, p["flat"]), x, params={"flat": flat}, input_grads=0 in argnums)
        dx, dp = rec.backward(g)
        grads = {0: dx, 1: dp["flat"]}
        return tuple(grads[i] for i in argnums)
    return vjp


defvjp_argnums(checkpoint, _recompute)


def unpack(c: Ctx, unit: Any, flat: Any, zero3: bool, dp: int) -> dict[str, Any]:
    """The unit's named local parameters from its flat vector (gathered over dp under ZeRO-3)."""
    if zero3 and dp > 1:
        flat = ad.all_gather(flat, c.dev, 0, "dp")
    return unit_params(unit, flat)


def stage_program(c: Ctx, meta: dict, units: list, tokens: Any, targets: Any,
                  gatherer: Gatherer | None = None) -> Callable[..., Any]:
    """``fn(params, x)``: the stage's forward on this device (``x``: tokens on the first stage).
    ``gatherer``: ZeRO-3's gather buffer, through which every unit runs as FSDP runs it (:mod:`.fsdp`)
    unless recomputed (a block that runs again in the backward gathers again anyway)."""
    zero3, dp = meta["zero"] == 3, meta["dp"]
    fsdp = zero3 and dp > 1 and gatherer is not None
    tied = c.skeleton.tie_embeddings

    def fn(params: dict[str, Any], x: Any) -> Any:
        seen: dict[str, Any] = {}  # tied embeddings: the head reads the embedding's parameters
        for u in units:
            flat = params[u.name]
            if u.name == "embed":
                def run(xx: Any, P: dict) -> Any:
                    if tied:
                        seen.update(P)
                    return embed(c, P, tokens)
            elif u.name == "final":
                def run(xx: Any, P: dict) -> Any:
                    return final_loss(c, {**seen, **P}, xx, targets)
            else:
                def run(xx: Any, P: dict, index: int = int(u.name[7:])) -> Any:
                    return block(c, P, index, xx)
            if meta["recompute"] and u.name.startswith("blocks."):
                flops = c.block_flops * np.shape(x)[0]  # rows of this microbatch

                def charge(flops: float = flops) -> None:
                    c.dev.compute(flops=flops, name="recompute")

                def again(xx: Any, ff: Any, u: Any = u, run: Any = run) -> Any:
                    if fsdp:  # gathered for this block's forward or its recomputation only
                        gatherer.note_unit(u)
                    return run(xx, unpack(c, u, ff, zero3, dp))
                x = checkpoint(x, flat, again, charge)
            elif fsdp and not (tied and u.name in ("embed", "final")):
                def whole(xx: Any, full: Any, u: Any = u, run: Any = run) -> Any:
                    return run(xx, unit_params(u, full))
                x = fsdp_unit(x, flat, whole, gatherer, [])
            else:
                x = run(x, unpack(c, u, flat, zero3, dp))
        return x
    return fn


def stage_forward(step: Any, s: int, m: int, received: Any) -> tuple[Any, Any, float | None]:
    """The executor's hook: stage ``s`` of microbatch ``m`` (see the module doc)."""
    st = step.st
    meta = st["meta"]
    c = Ctx(step.dev, meta["tp"], meta["cp"], meta["sp"], st["skeleton"])
    c.block_flops = st["flops"].get("block", 0.0)
    # dropout's coordinates: this replica's rows are dp_rank·R … of dp·R, its microbatch m·b … of them
    c.step, b = st.get("number"), step.rows
    c.batch = st.get("rows", b * step.spec.microbatches) * meta["dp"]
    c.row0 = (step.dev.group_rank("dp") if meta["dp"] > 1 else 0) * (c.batch // meta["dp"]) + m * b
    first, last = s == 0, s == step.spec.placement.stages - 1
    tokens = step.xs[m] if first else None
    targets = step.ys[m] if last else None
    fn = stage_program(c, meta, st["units"][s], tokens, targets, Gatherer(step.dev, st))
    x = tokens if first else received
    rec = nn.vjp(fn, x, params=st["params"][s], input_grads=not first)
    buffer = st.get("gather_buffer")  # ZeRO-3's gathered parameters: parameters, not activations
    nbytes = saved_bytes(rec, [*st["params"][s].values(), *([buffer] if buffer is not None else [])])
    st["memory"]["stage"][s] = nbytes
    rec = Tracked(rec, st, nbytes)
    if last:
        return rec, None, float(rec.output)
    return rec, rec.output, None
