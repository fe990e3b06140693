"""Lab: a 3D-parallel transformer step — data, tensor and pipeline parallelism at once.

You have 8 devices (one H100 node, the "h100-node" preset) and a GPT (``virtualpar.nn.GPT``).
``virtualpar.parallel.ParallelTrainer`` trains it with any ``ParallelConfig(dp, tp, pp, cp,
microbatches, schedule, zero, sequence_parallel, recompute)``; ``virtualpar.parallel.plan``
models the step time and memory of every configuration without starting a process.

TASK 1
    ``configure(model, batch, memory_bytes)``: return a ParallelConfig that uses all three axes,
    dp = tp = pp = 2 (cp = 1), fits ``memory_bytes`` per device, and whose modelled step time is
    within 10% of the best such configuration.  Choose the microbatches, the schedule, the ZeRO
    stage, sequence parallelism and recomputation.  You may call ``virtualpar.parallel.plan.plan``
    (see docs/parallel.md) or reason with the closed forms in LAB.md.
TASK 2
    ``bubble(schedule, pp, microbatches, virtual=2)``: the pipeline bubble fraction of "gpipe",
    "1f1b" and "interleaved_1f1b" (``virtual`` model chunks per rank) with equal forward and
    backward costs and free links.

HOW IT IS CHECKED  (virtualpar lab check parallel-3d parallel_3d.py)
    - with a generous and a tight memory budget: 3D, fits, within 10% of the best (the planner's
      model of the step);
    - your configuration trains a small float64 GPT on 8 device processes exactly as one process
      does (2 AdamW steps, 1e-9);
    - bubble() against the closed forms.
"""

from virtualpar.parallel import ParallelConfig


def configure(model, batch, memory_bytes):
    # TODO 1: try the schedules, microbatches (dividing batch / dp), zero 0/1/3, sequence_parallel and
    #         recompute; keep what fits memory_bytes; return the fastest.  Hint: virtualpar.parallel.plan.plan
    #         returns (configurations that fit, fastest first; how many did not), each with .config.
    raise NotImplementedError("write configure")


def bubble(schedule, pp, microbatches, virtual=2):
    # TODO 2: (pp - 1) / (microbatches + pp - 1) for gpipe and 1f1b;
    #         interleaving divides the bubble by virtual
    raise NotImplementedError("write bubble")
