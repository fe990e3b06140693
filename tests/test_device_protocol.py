"""The device protocol holds: VirtualDevice implements it, the layers above the runtime import
nothing from runtime/ or transport/, and an upper layer's program runs on a minimal fake."""

from __future__ import annotations

import ast
import contextlib
import inspect
import os

import numpy as np

import virtualpar
from virtualpar import nn
from virtualpar.device import Device
from virtualpar.runtime import VirtualDevice

UPPER = ("nn", "sharding", "ops", "tensor_parallel", "pipeline", "strategies", "timeline")
ROOT = os.path.dirname(virtualpar.__file__)


def test_virtual_device_provides_every_member_of_the_protocol():
    members = [m for m in dir(Device) if not m.startswith("_")] + list(Device.__annotations__)
    missing = [
        m
        for m in set(members)
        if not hasattr(VirtualDevice, m) and m not in ("rank", "size", "index", "mesh", "state")
    ]
    assert missing == []
    for name in ("send", "recv", "all_reduce", "all_gather", "barrier", "compute"):
        proto = inspect.signature(getattr(Device, name)).parameters
        real = inspect.signature(getattr(VirtualDevice, name)).parameters
        assert list(proto) == list(real), name


def test_upper_layers_import_nothing_from_the_runtime():
    offenders = []
    for pkg in UPPER:
        folder = os.path.join(ROOT, pkg)
        if not os.path.isdir(folder):
            continue
        for dirpath, _, files in os.walk(folder):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                tree = ast.parse(open(path).read())
                for node in ast.walk(tree):
                    names = []
                    if isinstance(node, ast.ImportFrom):
                        names = [("." * node.level) + (node.module or "")]
                    elif isinstance(node, ast.Import):
                        names = [a.name for a in node.names]
                    for n in names:
                        if any(part in ("runtime", "transport") for part in n.replace(".", " ").split()):
                            if not _inside_function(tree, node):
                                offenders.append(f"{os.path.relpath(path, ROOT)}: {n}")
    assert offenders == []


def _inside_function(tree: ast.AST, target: ast.AST) -> bool:
    """Imports inside a function body are drivers' conveniences (a demo starting a cluster), not
    the device program's; the rule is about what the device-side modules depend on."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and target in list(ast.walk(node)):
            return True
    return False


class FakeDevice:
    """A one-device stand-in: collectives of a group of one are the identity."""

    rank, size, state, mesh, index = 0, 1, {}, None, None
    name = "fake"
    clock = wall = 0.0

    def group(self, group=None):
        return (0,)

    def group_rank(self, group=None):
        return 0

    def all_reduce(self, x, op="sum", group=None, algorithm=None, timeout=None):
        return np.array(x, copy=True)

    def compute(self, flops=0.0, bytes=0.0, dtype="float32", name="compute", since=None):
        return 0.0

    def comm_stream(self, since=None):
        return contextlib.nullcontext()

    def wait_comm_stream(self):
        return 0.0

    def send(self, *a, **k):
        raise AssertionError("no peers")

    recv = isend = irecv = ssend = issend = sendrecv = wait_any = iprobe = probe = send
    all_gather = reduce_scatter = broadcast = reduce = gather = scatter = all_to_all = send
    barrier = matmul = send


def test_a_pipeline_step_runs_on_a_fake_device():
    """One pipeline rank, one stage: the executor's device program needs only the protocol."""
    from virtualpar.pipeline import Pipeline, PipelinedOperation
    from virtualpar.pipeline.device_step import run_step

    model = nn.Sequential(nn.Linear(4, 4, dtype=np.float64), nn.Linear(4, 2, seed=1, dtype=np.float64))
    op = PipelinedOperation(Pipeline(model, cuts=[]), "1f1b", microbatches=2, optimizer=nn.SGD(0.1))
    spec = op._plan(1)
    dev = FakeDevice()
    dev.state = {op.key: {"spec": spec, "modules": {0: model}, "params": {0: model.parameters()},
                          "optimizers": {0: nn.SGD(0.1)}, "flops": {0: 0.0}}}
    x, y = np.ones((4, 4)), np.zeros((4, 2))
    dev.state[op.key + "/x"], dev.state[op.key + "/y"] = x, y
    assert isinstance(dev, Device)
    loss, prank, records = run_step(dev, op.key)
    want = nn.reference_train(
        nn.Sequential(nn.Linear(4, 4, dtype=np.float64), nn.Linear(4, 2, seed=1, dtype=np.float64)),
        [(x, y)],
        nn.mse_loss,
        nn.SGD(0.1),
        1,
        2,
    )[0][0]
    assert prank == 0 and loss == want and [str(r.action) for r in records] == ["0F0", "0B0", "0F1", "0B1"]
