"""Reference solution of the 1F1B lab (kept out of the skeleton)."""

from virtualpar.pipeline import Action


def one_f_one_b(ranks, microbatches):
    schedule = {}
    for r in range(ranks):
        warm = min(ranks - r - 1, microbatches)
        actions = [Action(r, "F", m) for m in range(warm)]
        for m in range(microbatches - warm):  # steady state: one forward, one backward
            actions += [Action(r, "F", warm + m), Action(r, "B", m)]
        actions += [Action(r, "B", m) for m in range(microbatches - warm, microbatches)]
        schedule[r] = actions
    return schedule
