from virtualpar.pipeline import Action
def one_f_one_b(ranks, microbatches):
    return {
        r: [Action(r, "F", m) for m in range(microbatches)] + [Action(r, "B", m) for m in range(microbatches)]
        for r in range(ranks)
    }
