"""Lab: ZeRO-1 data parallelism — reduce-scatter, a sharded Adam, all-gather.

Every device holds the same parameters ``params`` (a flat float64 vector of P elements, P divisible
by the number of devices n) and its OWN gradient ``grad`` (from its own slice of the batch).
Plain data parallelism all-reduces the gradients and runs Adam on all P parameters on every
device: the optimizer state (m and v) costs 2P floats per device.  ZeRO stage 1 shards it.

TASK
    Write ``zero1_step(dev, params, grad, state, lr=1e-2, betas=(0.9, 0.999), eps=1e-8)``: one
    training step that returns the new parameters (all P of them, the same on every device), equal
    to Adam applied to the MEAN of the devices' gradients.  ``state`` is a dict that is yours: the
    same dict comes back at the next step, so keep m, v and the step count t in it — for YOUR SHARD
    only (P/n elements each).
      1. reduce-scatter the gradients: device r gets the sum of shard r (then divide by n);
      2. Adam on shard r:  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
         p = p - lr * (m / (1-b1**t)) / (sqrt(v / (1-b2**t)) + eps);
      3. all-gather the updated shards.

RULES
    Only ``dev.reduce_scatter`` and ``dev.all_gather`` (plus ``dev.rank``/``dev.size``); the other
    collectives and point-to-point raise in this lab.

HOW IT IS CHECKED  (virtualpar lab check zero1 zero1.py)
    5 steps on 1 to 4 devices against a single-process numpy Adam on the mean gradient (within
    1e-12); the state you keep holds at most 2P/n numbers; one reduce-scatter and one all-gather of P
    elements per step (2(n-1)/n * P * 8 bytes per device, as much as the all-reduce it replaces).
"""

import numpy as np


def zero1_step(dev, params, grad, state, lr=1e-2, betas=(0.9, 0.999), eps=1e-8):
    n, r = dev.size, dev.rank
    # TODO 1: g = my shard of the mean gradient (dev.reduce_scatter(grad, op="sum") / n)
    # TODO 2: p = my shard of params (elements r*P/n .. (r+1)*P/n)
    # TODO 3: create m, v (zeros like g) and t = 0 in state on the first call; one Adam step on p
    # TODO 4: return dev.all_gather(new p)
    raise NotImplementedError("write zero1_step: see the TODOs above")
