"""Lowering: insert the transfers a schedule implies, in an order that cannot deadlock.

For every F(s, m) whose next stage lives on another rank, a send of the activation right after it
(``SF``) and, on the consumer's rank, its receive right before F(s+1, m) (``RF``); likewise for a
backward (B or I) of stage s > 0 whose previous stage lives elsewhere: ``SB`` after it, ``RB``
right before the consumer's backward.  Sends are posted without waiting (the executor waits for
them all at the end of the step) and every receive sits just before the action that needs it, so
a rank blocks only on a value the producer's own order makes: if the compute orders can finish
(:func:`~virtualpar.pipeline.simulate.simulate` proves it), the lowered program can too.
Stages on the same rank hand values over in memory, no transfer.

Weights that live on another rank than the one computing (the unified strategies' FSDP-like
mappings): the weight rank sends the stage's weights (``SW``, all posted at the start of its
list) and the compute rank receives them (``RW``) right before each F and B of that stage; after a
backward the compute rank sends the gradient back (``SG``) and the weight rank receives them all
(``RG``) at the end of its list, then steps its optimizer.
"""

from __future__ import annotations

from .actions import Action, Schedule
from .placement import Placement

__all__ = ["lower"]


def lower(schedule: Schedule, placement: Placement) -> Schedule:
    """The schedule with SF/RF/SB/RB actions inserted (``None`` steps dropped)."""
    last = placement.stages - 1
    where = placement.rank_of
    out: Schedule = {r: [] for r in range(placement.ranks)}
    sends_w: dict[int, list[Action]] = {r: [] for r in range(placement.ranks)}
    recvs_g: dict[int, list[Action]] = {r: [] for r in range(placement.ranks)}
    for r, actions in schedule.items():
        seq = out[r]
        for a in actions:
            if a is None:
                continue
            s, k, m = a
            w = placement.weight_rank(s, m)
            if k == "F" and s > 0 and where(s - 1, m) != r:
                seq.append(Action(s, "RF", m))
            if k in ("B", "I") and s < last and where(s + 1, m) != r:
                seq.append(Action(s, "RB", m))
            if k in ("F", "B") and w != r:
                seq.append(Action(s, "RW", m))
                sends_w[w].append(Action(s, "SW", m))
            seq.append(a)
            if k == "F" and s < last and where(s + 1, m) != r:
                seq.append(Action(s, "SF", m))
            if k in ("B", "I") and s > 0 and where(s - 1, m) != r:
                seq.append(Action(s, "SB", m))
            if k == "B" and w != r:
                seq.append(Action(s, "SG", m))
                recvs_g[w].append(Action(s, "RG", m))
    return {r: sends_w[r] + out[r] + recvs_g[r] for r in out}
