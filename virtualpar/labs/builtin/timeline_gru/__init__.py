"""Lab 7: timeline parallelism for a GRU with SequencePipe."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .... import Mesh, VirtualCluster, nn
from ....errors import VirtualParError
from ....sim import Hardware
from ....timeline import TimelineParallel, reference_step
from ...harness import describe
from ...lab import CheckOptions, Lab
from ...report import Report
from ...student import load_student

FUNCTIONS = ("GRUClassifier", "timeline_makespan")


def _data(batch: int = 4, length: int = 12, hidden: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, length, hidden))
    return (x,), ((x[:, :, 0].sum(axis=1) > 0).astype(np.int64),)


def check(path: str, options: CheckOptions) -> Report:
    import cloudpickle

    module = load_student(path, FUNCTIONS)
    cloudpickle.register_pickle_by_value(module)  # the model class travels to the devices by value
    reference = load_student(LAB.reference, FUNCTIONS)
    report = Report(LAB.name)
    inputs, labels = _data()
    try:
        want, _ = reference_step(reference.GRUClassifier(), inputs, labels)
        got, _ = reference_step(module.GRUClassifier(), inputs, labels)
        fwd = [] if abs(got - want) <= 1e-12 * abs(want) else [
            f"the loss over the whole sequence on one device is {got!r}; expected {want!r}"]
    except Exception as exc:  # the student's forward / loss / init states
        fwd = [f"{type(exc).__name__}: {exc}"]
    report.add("forward and loss match a GRU over the whole sequence", not fwd, output="\n".join(fwd))
    split = []
    for devices, microbatches in (((2, 2), (3, 1)) if options.quick else ((1, 1), (2, 2), (3, 1), (4, 2))):
        if fwd:
            split.append("not judged until the forward is right")
            break
        model = module.GRUClassifier()
        before = model.state_dict()
        _, grads = reference_step(module.GRUClassifier(), inputs, labels, microbatches=microbatches)
        op = TimelineParallel(model, microbatches=microbatches, optimizer=nn.SGD(1.0))
        try:
            with VirtualCluster(Mesh({"time": devices}), timeout=10, run_timeout=60) as cluster:
                cluster.execute(op, inputs, labels)
                after = op.state_dict(cluster)
        except VirtualParError as exc:
            split.append(f"{devices} devices, {microbatches} microbatch(es): {describe(exc, path)}")
            continue
        for name, g in grads.items():
            moved = (
                before[name] - after[name]
            )  # one SGD step with lr = 1 moves a weight by minus its gradient
            if not np.allclose(moved, g, rtol=1e-10, atol=1e-12):
                split.append(
                    f"{devices} devices, {microbatches} microbatch(es): the gradient of {name} differs from "
                    f"the whole sequence's by up to {np.max(np.abs(moved - g)):.3g} — is every segment "
                    f"starting from the state it is handed, and returning its last one?"
                )
                break
    report.add("time-split gradients equal the whole sequence's", not split, output="\n".join(split[:3]))
    wrong = []
    for devices, microbatches, backward in ((3, 2, 1), (4, 8, 2), (1, 5, 1), (5, 3, 3)):
        want = (microbatches + devices - 1) * (1 + backward)
        try:
            got = float(module.timeline_makespan(devices, microbatches, backward))
        except Exception as exc:
            wrong.append(
                f"timeline_makespan({devices}, {microbatches}, {backward}) raised {type(exc).__name__}: "
                f"{exc}"
            )
            continue
        if got != want:
            wrong.append(
                f"timeline_makespan({devices}, {microbatches}, {backward}) = {got:g}; expected {want}"
            )
    if not wrong and not fwd:  # and the formula holds on an executed run
        op = TimelineParallel(module.GRUClassifier(num_layers=1), microbatches=2, costs={"F": 1, "B": 1})
        with VirtualCluster(Mesh({"time": 3}), hardware=Hardware.unit()) as cluster:
            cluster.execute(op, inputs, labels)
            measured = max(cluster.clocks())
        if measured != module.timeline_makespan(3, 2, 1):
            wrong.append(
                f"an executed step of 3 devices x 2 microbatches took {measured:g} on the modelled clock"
            )
        report.timeline = f"the executed step (3 time segments x 2 microbatches, F = B = 1):\n{op.timeline()}"
    report.add("makespan: the closed form, and an executed run", not wrong, output="\n".join(wrong[:3]))
    return report


LAB = Lab(
    name="timeline-gru",
    goal="Train a GRU with its sequence split along time across devices (SequencePipe)",
    concept="timeline parallelism: a pipeline of time segments sharing one set of weights",
    difficulty="intermediate",
    folder=Path(__file__).parent,
    functions=FUNCTIONS,
    check_fn=check,
)
