"""The torch peer of ``bench_train.py``: GPT ``small`` (vocab 2048, d 256, 8 layers, 8 heads, seq 128,
pre-norm LayerNorm, GELU MLP of 4·d), a batch of 8 × 128, AdamW, float32, on 8 processes over gloo
as ``bench_train.py`` runs it: dp=2 × pp=2 × tp=2, 4 microbatches, 1F1B.

- pipelining: ``torch.distributed.pipelining`` (``PipelineStage`` + ``Schedule1F1B``), 4 blocks a
  stage, the embeddings on the first and the head on the last;
- tensor parallelism: DTensor's ``parallelize_module`` on every block (Q, K, V and the MLP's first
  layer column-parallel, the projections row-parallel, Megatron's split); the embeddings and the
  head are replicated (torch's vocabulary-parallel loss needs a DTensor all the way to the loss,
  which the pipeline's stage outputs are not);
- data parallelism: the gradients averaged over dp with one all-reduce per parameter after the
  backward.

One BLAS thread per process (8 processes on the machine's cores, as virtualpar's devices).  Prints
one JSON line: the median seconds of 3 steps after one untimed step."""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as tnn

V, D, L, H, S, B, M = 2048, 256, 8, 8, 128, 8, 4
DP, PP, TP = 2, 2, 2


class Block(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = tnn.LayerNorm(D), tnn.LayerNorm(D)
        self.q, self.k, self.v, self.o = (tnn.Linear(D, D) for _ in range(4))
        self.up, self.down = tnn.Linear(D, 4 * D), tnn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.ln1(x)
        q, k, v = (f(h).view(b, s, -1, D // H).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = tnn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, s, -1))
        return x + self.down(tnn.functional.gelu(self.up(self.ln2(x)), approximate="tanh"))


class Stage(tnn.Module):
    def __init__(self, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.tok, self.pos = tnn.Embedding(V, D), tnn.Embedding(S, D)
        self.blocks = tnn.ModuleList(Block() for _ in range(L // PP))
        if last:
            self.norm, self.head = tnn.LayerNorm(D), tnn.Linear(D, V, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)) if self.last else x


def worker(rank: int, port: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=DP * PP * TP)
    mesh = init_device_mesh("cpu", (DP, PP, TP), mesh_dim_names=("dp", "pp", "tp"))
    pp = mesh["pp"].get_local_rank()
    torch.manual_seed(0)
    model = Stage(pp == 0, pp == PP - 1)
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
            "up": ColwiseParallel(), "down": RowwiseParallel()}
    for blk in model.blocks:
        parallelize_module(blk, mesh["tp"], plan)
    stage = PipelineStage(model, pp, PP, torch.device("cpu"), group=mesh["pp"].get_group())
    loss = tnn.CrossEntropyLoss()
    schedule = Schedule1F1B(stage, M, loss_fn=lambda logits, y: loss(logits.reshape(-1, V), y.reshape(-1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    ids = (rng.integers(0, 16, (B, 1)) + np.arange(S + 1)[None, :]) % 16
    rows = slice(mesh["dp"].get_local_rank() * B // DP, (mesh["dp"].get_local_rank() + 1) * B // DP)
    x, y = torch.tensor(ids[rows, :-1]), torch.tensor(ids[rows, 1:])
    dp_group = mesh["dp"].get_group()
    times = []
    for i in range(4):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        if pp == 0:
            schedule.step(x)
        elif pp == PP - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
        for p in model.parameters():
            if p.grad is not None:
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                dist.all_reduce(g, group=dp_group)
                g /= DP
        opt.step()
        dist.barrier()
        if i:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"step_s": statistics.median(times)}, f)
    dist.destroy_process_group()


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.json")
        mp.spawn(worker, args=(port, out), nprocs=DP * PP * TP, join=True)
        with open(out) as f:
            print(f.read())


if __name__ == "__main__":
    sys.exit(main())
