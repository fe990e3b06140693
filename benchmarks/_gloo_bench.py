"""torch.distributed (gloo backend) reference for ``bench_collectives.py``.

    python _gloo_bench.py -n 2 --sizes 4096,1048576 [--p2p] [--budget 0.15] [--repeats 3]

Forks ``n`` processes (torch is imported only after the fork), joins them in a gloo process group
over TCP on 127.0.0.1, and measures with the virtualpar methodology: ``dist.send``/``dist.recv``
latency and bandwidth between ranks 0 and 1 (``--p2p``), and in-place ``dist.all_reduce`` (sum,
float32 zeros) per size, the slowest rank's mean time.  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import statistics
import time
from typing import Any

from _references import reference_parser  # this directory: the script runs as a file


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(rank: int, n: int, port: int, args: argparse.Namespace, conn: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)

    def timed(fn: Any, reduce_max: bool = True) -> float:
        fn(1)
        t = torch.tensor([_once(fn, 1)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        iters = 1 if args.quick else max(1, min(1000, int(args.budget / max(float(t[0]), 1e-6))))
        samples = []
        for _ in range(args.repeats):
            t = torch.tensor([_once(fn, iters)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX if reduce_max else dist.ReduceOp.SUM)
            samples.append(float(t[0]))
        return statistics.median(samples)

    result: dict[str, Any] = {"ranks": n, "torch": torch.__version__, "allreduce_GBps": {}}
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.p2p:
        small = torch.ones(4096, dtype=torch.uint8)

        def pingpong(iters: int) -> None:
            for _ in range(iters):
                if rank == 0:
                    dist.send(small, 1)
                    dist.recv(small, 1)
                elif rank == 1:
                    dist.recv(small, 0)
                    dist.send(small, 0)

        result["latency_4KiB_s"] = timed(pingpong) / 2
        result["bandwidth_GBps"] = {}
        for size in sizes:
            buf, ack = torch.ones(size, dtype=torch.uint8), torch.zeros(1, dtype=torch.uint8)

            def stream(iters: int, buf: Any = buf, ack: Any = ack) -> None:
                for _ in range(iters):
                    (dist.send if rank == 0 else dist.recv)(buf, 1 - rank)
                (dist.recv if rank == 0 else dist.send)(ack, 1 - rank)

            result["bandwidth_GBps"][str(size)] = size / timed(stream) / 1e9
    for size in sizes:
        x = torch.zeros(size // 4, dtype=torch.float32)
        result["allreduce_GBps"][str(size)] = (
            size / timed(lambda iters, x=x: [dist.all_reduce(x) for _ in range(iters)]) / 1e9
        )
    dist.destroy_process_group()
    if rank == 0:
        conn.send(result)
    conn.close()


def _once(fn: Any, iters: int) -> float:
    t0 = time.perf_counter()
    fn(iters)
    return (time.perf_counter() - t0) / iters


def main() -> None:
    ap = reference_parser()
    ap.add_argument("-n", type=int, default=2, help="processes (default 2)")
    args = ap.parse_args()
    ctx = mp.get_context("fork")
    port = _free_port()
    parent, child = ctx.Pipe()
    procs = [ctx.Process(target=_child, args=(r, args.n, port, args, child)) for r in range(args.n)]
    for p in procs:
        p.start()
    result = parent.recv() if parent.poll(600) else {"skipped": "gloo processes did not answer"}
    for p in procs:
        p.join(30)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
