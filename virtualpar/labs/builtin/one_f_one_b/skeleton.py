"""Lab: the 1F1B pipeline schedule, written as data.

TASK
    Write ``one_f_one_b(ranks, microbatches)``: the 1F1B (PipeDream-Flush) schedule for a pipeline of
    ``ranks`` stages (stage r on rank r) and ``microbatches`` microbatches, as a dict
    ``{rank: [Action, ...]}`` listing, for each rank, the actions it runs in order.
    ``Action(stage, kind, microbatch)`` with kind "F" (forward) or "B" (backward); it prints as "2B1".
    Rank r warms up with min(ranks - r - 1, microbatches) forwards, then alternates one forward and
    one backward, then drains the remaining backwards.

RULES
    Build lists only: no timing, no sending.  virtualpar's validator checks the dependencies
    (F of stage s after F of stage s-1, B of stage s after B of stage s+1 and after its own F).

HOW IT IS CHECKED  (virtualpar lab check one-f-one-b one_f_one_b.py)
    On a grid of (ranks, microbatches), including microbatches < ranks:
    - the schedule is valid: every F and B once, in an order that can run;
    - makespan under unit costs (F = B = 1) is 2(M + R - 1), and with F = 1, B = 2 it is 3(M + R - 1);
    - the bubble fraction is (R - 1) / (M + R - 1);
    - the peak number of microbatches whose activations stage s holds is min(R - s, M) (GPipe holds M).
"""

from virtualpar.pipeline import Action


def one_f_one_b(ranks, microbatches):
    schedule = {}
    for r in range(ranks):
        actions = []
        # TODO 1: warm-up: forwards of microbatches 0 .. min(ranks - r - 1, microbatches) - 1
        # TODO 2: steady state: alternate Action(r, "F", next forward) and Action(r, "B", next backward)
        # TODO 3: cool-down: the backwards not yet run
        schedule[r] = actions
    raise NotImplementedError("write one_f_one_b: see the TODOs above")
