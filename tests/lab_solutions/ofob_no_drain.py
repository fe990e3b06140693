"""1F1B without the cool-down: the last backwards never run."""
from virtualpar.pipeline import Action


def one_f_one_b(ranks, microbatches):
    schedule = {}
    for r in range(ranks):
        warm = min(ranks - r - 1, microbatches)
        actions = [Action(r, "F", m) for m in range(warm)]
        for m in range(microbatches - warm):
            actions += [Action(r, "F", warm + m), Action(r, "B", m)]
        schedule[r] = actions
    return schedule
