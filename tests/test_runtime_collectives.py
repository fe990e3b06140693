"""Every collective on real device processes, checked against the single-process numpy oracle.

One test body per collective.  Each body runs on a module-scoped cluster per mesh — 1-D meshes of
1, 2, 3, 4 and 8 devices and the 2-D meshes dp=2 x tp=2 and dp=2 x tp=4 (groups "tp", "dp",
("dp", "tp") and None) — and loops over dtypes x algorithms x reduce ops x shapes inside ONE
``cluster.run`` (starting a cluster costs tens of ms, a collective about one).  Inputs are drawn on
each device from ``default_rng([case seed, rank])`` and drawn again in the driver for the oracle
(``virtualpar.collectives.reference``).  Every case also checks that results are bit-identical on
every device that must agree and from one run to the next, and that the input was not modified.

Bytes moved are asserted exactly from ``cluster.stats()`` against the closed forms of the
algorithms, and hypothesis checks the algebraic identities on a 4-device cluster.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from virtualpar import Mesh, VirtualCluster
from virtualpar.collectives import ALGORITHMS, REDUCE_OPS, reference
from virtualpar.errors import DeviceError, UsageError

DTYPES = ("float32", "float64", "int64")
OPS = tuple(sorted(REDUCE_OPS))
RTOL = {"float32": 1e-5, "float64": 1e-12}
TIMEOUT = 20.0  # a hang fails within this many seconds instead of blocking the suite

MESHES: dict[str, Any] = {
    "n1": 1, "n2": 2, "n3": 3, "n4": 4, "n8": 8,
    "dp2xtp2": {"dp": 2, "tp": 2},
    "dp2xtp4": {"dp": 2, "tp": 4},
}
GROUPS_2D = ("tp", "dp", ("dp", "tp"), None)


# -- clusters -------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=list(MESHES), ids=list(MESHES))
def cluster(request):
    """One cluster per mesh; pytest groups the tests by param, so one is alive at a time."""
    with VirtualCluster(Mesh(MESHES[request.param]), timeout=TIMEOUT) as c:
        yield c


def groups_of(mesh: Mesh) -> tuple:
    return (None,) if mesh.ndim == 1 else GROUPS_2D


def lite(mesh: Mesh) -> bool:
    """2-D meshes run 4 groups and up to 8 devices: fewer shapes there keep the suite fast."""
    return mesh.ndim > 1


# -- cases: plain dicts (they travel to the devices), inputs drawn from (seed, rank) ---------------
def piece_shape(shape: tuple, pos: int) -> tuple[int, ...]:
    """A shape whose entries may depend on the group position: "p" -> pos % 3 (0 included), "p1" -> pos +
    1."""
    return tuple(pos % 3 if s == "p" else pos + 1 if s == "p1" else s for s in shape)


def make_input(case: dict, rank: int, pos: int) -> np.ndarray:
    """The deterministic input of device ``rank`` (position ``pos`` in its group) for ``case``."""
    shape = piece_shape(case["shape"], pos)
    dtype = np.dtype(case["dtype"])
    op = case.get("op")
    rng = np.random.default_rng([case["seed"], rank])
    size = int(np.prod(shape, dtype=np.int64))
    if dtype.kind == "i":
        # small factors keep an 8-way product exact; sums stay far from overflow
        vals = rng.choice([-2, -1, 1, 2], size) if op == "prod" else rng.integers(-1000, 1000, size)
    elif op in ("max", "min"):
        vals = rng.uniform(-10.0, 10.0, size)
    else:
        vals = rng.uniform(0.5, 1.5, size)  # positive: sums never cancel, so rtol stays meaningful
    return np.asarray(vals).astype(dtype).reshape(shape)


def case_key(case: dict) -> str:
    parts = [case["coll"], f"group={case['group']!r}", case["dtype"]]
    parts += [f"{k}={case[k]!r}" for k in ("algorithm", "op", "shape", "dim", "root", "split_dim",
                                           "concat_dim") if k in case]
    return " ".join(parts)


def finish(cases: list[dict], base_seed: int) -> list[dict]:
    for i, case in enumerate(cases):
        case["seed"] = base_seed * 100_000 + i
    return cases


def _kwargs(case: dict) -> dict[str, Any]:
    kw = {k: case[k] for k in ("op", "dim", "root", "split_dim", "concat_dim", "algorithm") if k in case}
    kw["group"] = case["group"]
    return kw


def _call(dev, case: dict) -> tuple[Any, bool]:
    """Run one case on this device: (result, input left untouched?)."""
    ranks = dev.group(case["group"])
    pos = ranks.index(dev.rank)
    root_only = case["coll"] in ("broadcast", "scatter") and pos != case["root"]
    x = None if root_only else make_input(case, dev.rank, pos)
    result = getattr(dev, case["coll"])(x, **_kwargs(case))
    intact = x is None or x.tobytes() == make_input(case, dev.rank, pos).tobytes()
    return result, intact


def run_cases(dev, cases: list[dict]) -> list[tuple[Any, bool]]:
    """Device side: every case in order; a failure names its case."""
    out = []
    for case in cases:
        try:
            out.append(_call(dev, case))
        except Exception as exc:
            raise RuntimeError(f"case [{case_key(case)}] failed on rank {dev.rank}: "
                               f"{type(exc).__name__}: {exc}") from exc
    return out


def run_one(dev, case: dict) -> Any:
    return _call(dev, case)[0]


# -- driver-side checking ---------------------------------------------------------------------------
AGREE = {"all_reduce", "all_gather", "broadcast"}  # collectives whose result is the same on every member
ORACLE_PARAMS = ("op", "dim", "root", "split_dim", "concat_dim")


def compare(got: Any, want: Any, dtype: str) -> str | None:
    """None if ``got`` matches the oracle's ``want``; else why not."""
    if want is None:
        return None if got is None else f"expected None, got {type(got).__name__}"
    if not isinstance(got, np.ndarray):
        return f"expected an array, got {type(got).__name__}"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"expected {want.shape} {want.dtype}, got {got.shape} {got.dtype}"
    try:
        if dtype == "int64":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=0)
    except AssertionError as exc:
        return str(exc).strip().splitlines()[-1] if str(exc).strip() else "values differ"
    return None


def batch_key(case: dict) -> tuple:
    """Cases run in a few batches (algorithm x 0-d x negative dims): one failing path cannot hide the
    others."""
    negative = any(case.get(k, 0) < 0 for k in ("dim", "split_dim", "concat_dim"))
    return case.get("algorithm"), case["shape"] == (), negative


def verify(cluster: VirtualCluster, cases: list[dict]) -> None:
    """Run ``cases`` twice; check values, agreement across devices, run-to-run bits, untouched inputs."""
    problems: list[str] = []
    batches: dict[tuple, list[int]] = {}
    for i, case in enumerate(cases):
        batches.setdefault(batch_key(case), []).append(i)
    for key, idx in batches.items():
        batch = [cases[i] for i in idx]
        try:
            first = cluster.run(run_cases, batch)
            second = cluster.run(run_cases, batch)
        except Exception as exc:  # the device error names its case; the cluster resets and stays usable
            problems.append(f"batch {key} raised {type(exc).__name__}: {exc}")
            continue
        problems += check_batch(cluster.mesh, batch, first, second)
    if problems:
        head = f"{len(problems)} problem(s) on mesh {cluster.mesh} over {len(cases)} cases:\n  "
        pytest.fail(head + "\n  ".join(problems[:25]) + ("\n  ..." if len(problems) > 25 else ""),
                    pytrace=False)


def check_batch(mesh: Mesh, cases: list[dict], first: list, second: list) -> list[str]:
    problems: list[str] = []
    for i, case in enumerate(cases):
        key = case_key(case)
        for group in mesh.groups(case["group"]):
            xs = [None if case["coll"] in ("broadcast",
                                           "scatter") and p != case["root"] else make_input(case, r, p)
                  for p, r in enumerate(group)]
            params = {k: case[k] for k in ORACLE_PARAMS if k in case}
            expected = getattr(reference, case["coll"])(xs, **params)
            for pos, rank in enumerate(group):
                got, intact = first[rank][i]
                why = compare(got, expected[pos], case["dtype"])
                if why:
                    problems.append(f"[{key}] group {group} rank {rank}: {why}")
                if not intact:
                    problems.append(f"[{key}] rank {rank}: the input array was modified")
                again = second[rank][i][0]
                if (got is None) != (again is None) or (got is not None and got.tobytes() != again.tobytes()):
                    problems.append(f"[{key}] rank {rank}: result differs between two identical runs")
            if case["coll"] in AGREE:
                bits = {first[r][i][0].tobytes() for r in group if isinstance(first[r][i][0], np.ndarray)}
                if len(bits) > 1:
                    problems.append(f"[{key}] group {group}: results are not bit-identical across the group")
    return problems


def group_size(mesh: Mesh, group: Any) -> int:
    return len(mesh.groups(group)[0])


def roots_for(n: int) -> list[int]:
    return sorted({0, n // 2, n - 1})


def ops_for(dtype: str) -> list[str]:
    return [op for op in OPS if not (op == "avg" and dtype == "int64")]


# -- one test body per collective ------------------------------------------------------------------
def test_all_reduce(cluster):
    shapes = [(), (10,)] if lite(cluster.mesh) else [(), (2,), (10,), (3, 5)]
    cases = [dict(coll="all_reduce", group=g, dtype=dt, algorithm=algo, op=op, shape=shape)
             for g in groups_of(cluster.mesh) for dt in DTYPES for algo in ALGORITHMS["all_reduce"]
             for op in ops_for(dt) for shape in shapes]
    verify(cluster, finish(cases, 1))
    assert_avg_int_rejected(cluster,
                            dict(coll="all_reduce", group=None, dtype="int64", op="avg", shape=(4,), seed=1))


def test_all_gather(cluster):
    specs = [((3,), 0), (("p",), 0), ((2, "p1"), 1), (("p1", 3), 0), ((2, 3), -1)]
    if lite(cluster.mesh):
        specs = specs[1:3]
    cases = [dict(coll="all_gather", group=g, dtype=dt, algorithm=algo, shape=shape, dim=dim)
             for g in groups_of(cluster.mesh) for dt in DTYPES for algo in ALGORITHMS["all_gather"]
             for shape, dim in specs]
    verify(cluster, finish(cases, 2))


def test_reduce_scatter(cluster):
    # (10,) over 3/4/8 and (2, 7) over dim 1 are uneven; (1,) is smaller than n; (12, 2) splits evenly for n
    # <= 4
    specs = [((10,), 0), ((12, 2), 0), ((2, 7), 1), ((1,), 0), ((3, 5), -1)]
    if lite(cluster.mesh):
        specs = [((10,), 0), ((2, 7), 1)]
    cases = [dict(coll="reduce_scatter", group=g, dtype=dt, algorithm=algo, op=op, shape=shape, dim=dim)
             for g in groups_of(cluster.mesh) for dt in DTYPES for algo in ALGORITHMS["reduce_scatter"]
             for op in ops_for(dt) for shape, dim in specs]
    verify(cluster, finish(cases, 3))
    assert_avg_int_rejected(cluster,
                            dict(coll="reduce_scatter", group=None, dtype="int64", op="avg", shape=(8,),
                                 dim=0, seed=3))


def test_broadcast(cluster):
    shapes = [(), (10,), (3, 4)]
    cases = [dict(coll="broadcast", group=g, dtype=dt, algorithm=algo, shape=shape, root=root)
             for g in groups_of(cluster.mesh) for dt in DTYPES for algo in ALGORITHMS["broadcast"]
             for shape in shapes for root in roots_for(group_size(cluster.mesh, g))]
    verify(cluster, finish(cases, 4))


def test_reduce(cluster):
    shapes = [(), (10,)] if lite(cluster.mesh) else [(), (10,), (3, 4)]
    cases = [dict(coll="reduce", group=g, dtype=dt, algorithm=algo, op=op, shape=shape, root=root)
             for g in groups_of(cluster.mesh) for dt in DTYPES for algo in ALGORITHMS["reduce"]
             for op in ops_for(dt) for shape in shapes for root in roots_for(group_size(cluster.mesh, g))]
    verify(cluster, finish(cases, 5))
    assert_avg_int_rejected(cluster,
                            dict(coll="reduce", group=None, dtype="int64", op="avg", shape=(3,), root=0,
                                 seed=5))


def test_gather(cluster):
    specs = [((3,), 0), (("p",), 0), ((2, "p1"), 1), ((2, 3), -1)]
    cases = [dict(coll="gather", group=g, dtype=dt, algorithm=algo, shape=shape, dim=dim, root=root)
             for g in groups_of(cluster.mesh) for dt in DTYPES for algo in ALGORITHMS["gather"]
             for shape, dim in specs for root in roots_for(group_size(cluster.mesh, g))]
    verify(cluster, finish(cases, 6))


def test_scatter(cluster):
    specs = [((10,), 0), ((8, 2), 0), ((3, 7), 1), ((1,), 0), ((4, 5), -1)]
    cases = [dict(coll="scatter", group=g, dtype=dt, algorithm=algo, shape=shape, dim=dim, root=root)
             for g in groups_of(cluster.mesh) for dt in DTYPES for algo in ALGORITHMS["scatter"]
             for shape, dim in specs for root in roots_for(group_size(cluster.mesh, g))]
    verify(cluster, finish(cases, 7))


def test_all_to_all(cluster):
    cases = []
    for g in groups_of(cluster.mesh):
        n = group_size(cluster.mesh, g)
        # even splits in every (split, concat) combination, then uneven ones (10 rows, 7 columns)
        specs = [((2 * n, 3), 0, 0), ((2 * n, 3), 0, 1), ((3, n), 1, 0), ((2, 2, n), 2, 1),
                 ((10, 2), 0, 0), ((3, 7), 1, 1), ((10, 3), 0, 1)]
        cases += [dict(coll="all_to_all", group=g, dtype=dt, algorithm=algo, shape=shape, split_dim=s,
                       concat_dim=c)
                  for dt in DTYPES for algo in ALGORITHMS["all_to_all"] for shape, s, c in specs]
    verify(cluster, finish(cases, 8))


def barrier_rounds(dev, path: str, groups: list, rounds: int) -> list[Any]:
    """Append "round enter rank" before and "round exit rank" after each barrier (O_APPEND lines are
    atomic)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    results = []
    try:
        for k in range(rounds):
            for j, group in enumerate(groups):
                os.write(fd, f"{k} {j} enter {dev.rank}\n".encode())
                results.append(dev.barrier(group=group))
                os.write(fd, f"{k} {j} exit {dev.rank}\n".encode())
    finally:
        os.close(fd)
    return results


def test_barrier(cluster, tmp_path):
    groups = list(groups_of(cluster.mesh))
    rounds = 5
    path = str(tmp_path / "barrier.log")
    results = cluster.run(barrier_rounds, path, groups, rounds)
    assert all(r is None for res in results for r in res), results
    lines = [line.split() for line in open(path).read().splitlines()]
    assert len(lines) == 2 * rounds * len(groups) * cluster.size
    for k in range(rounds):
        for j, group in enumerate(groups):
            for members in cluster.mesh.groups(group):
                at = {(kind, int(r)): i for i, (kk, jj, kind, r) in enumerate(lines)
                      if int(kk) == k and int(jj) == j and int(r) in members}
                last_enter = max(at[("enter", r)] for r in members)
                first_exit = min(at[("exit", r)] for r in members)
                assert (
                    last_enter < first_exit
                ), f"round {k} group {group} {members}: a device left the barrier before all entered"


def assert_avg_int_rejected(cluster: VirtualCluster, case: dict) -> None:
    """op="avg" on int64 raises UsageError on the devices, re-raised as-is; the cluster stays usable."""
    with pytest.raises(UsageError, match="avg") as info:
        cluster.run(run_one, case)
    assert not isinstance(info.value, DeviceError)
    assert cluster.run(run_one, dict(case, op="sum")) is not None


# -- bytes moved, exactly ----------------------------------------------------------------------------
def measure(cluster: VirtualCluster, case: dict):
    cluster.reset_stats()
    cluster.run(run_one, case)
    return cluster.stats()


def ring_matrix(mesh: Mesh, group: Any, per_step_bytes: int, steps: int) -> np.ndarray:
    """Every member sends ``steps`` messages of ``per_step_bytes`` to its right neighbour in the group."""
    want = np.zeros((mesh.size, mesh.size), np.int64)
    for members in mesh.groups(group):
        n = len(members)
        for p in range(n):
            if n > 1:
                want[members[p], members[(p + 1) % n]] += steps * per_step_bytes
    return want


def direct_matrix(mesh: Mesh, group: Any, nbytes: int) -> np.ndarray:
    want = np.zeros((mesh.size, mesh.size), np.int64)
    for members in mesh.groups(group):
        for a in members:
            for b in members:
                if a != b:
                    want[a, b] = nbytes
    return want


def test_bytes_moved_closed_forms(cluster):
    mesh = cluster.mesh
    # 6 MiB exceeds every channel ring, so the payload streams in chunks; counted bytes must not care
    sizes = [240] if lite(mesh) else [240, 24 * 65536]
    for group, elems in ((g, e) for g in groups_of(mesh) for e in sizes):
        n = group_size(mesh, group)
        M = elems * 4  # float32: n divides elems for every group size used here (1, 2, 3, 4, 8)
        assert elems % n == 0
        base = dict(group=group, dtype="float32", shape=(elems,), seed=7)

        s = measure(cluster, dict(base, coll="all_reduce", algorithm="ring", op="sum"))
        # ring all_reduce: 2(n-1) steps of M/n to the right neighbour = 2(n-1)/n * M per device
        np.testing.assert_array_equal(s.bytes, ring_matrix(mesh, group, M // n, 2 * (n - 1)),
                                      err_msg=f"ring all_reduce group={group}")
        for members in mesh.groups(group):
            for r in members:
                assert s.sent(r) == 2 * (n - 1) * M // n
        assert s.messages.sum() == (2 * (n - 1)) * mesh.size if n > 1 else s.messages.sum() == 0
        assert s.host_to_device.sum() == 0 and s.device_to_host.sum() == 0

        s = measure(cluster, dict(base, coll="all_reduce", algorithm="direct", op="sum"))
        # direct all_reduce: the whole array to every peer = (n-1) * M per device
        np.testing.assert_array_equal(s.bytes, direct_matrix(mesh, group, M),
                                      err_msg=f"direct all_reduce group={group}")
        assert all(s.sent(r) == (n - 1) * M for r in range(mesh.size))

        piece = dict(group=group, dtype="float32", shape=(elems // n,), seed=8)
        s = measure(cluster, dict(piece, coll="all_gather", algorithm="ring", dim=0))
        # ring all_gather of pieces of M/n: n-1 steps of M/n = (n-1)/n * M per device
        np.testing.assert_array_equal(s.bytes, ring_matrix(mesh, group, M // n, n - 1),
                                      err_msg=f"ring all_gather group={group}")
        assert all(s.sent(r) == (n - 1) * M // n for r in range(mesh.size))

        s = measure(cluster, dict(base, coll="reduce_scatter", algorithm="ring", op="sum", dim=0))
        np.testing.assert_array_equal(s.bytes, ring_matrix(mesh, group, M // n, n - 1),
                                      err_msg=f"ring reduce_scatter group={group}")

        s = measure(cluster, dict(base, coll="broadcast", algorithm="tree", root=n - 1))
        # binomial broadcast: every non-root receives M exactly once, the root nothing
        for members in mesh.groups(group):
            assert [s.received(r) for r in members] == [M] * (n - 1) + [0], f"broadcast group={group}"

        if n & (n - 1) == 0:  # recursive doubling: log2(n) exchanges of M with partner r XOR 2^k
            s = measure(cluster, dict(base, coll="all_reduce", algorithm="tree", op="sum"))
            want = np.zeros_like(s.bytes)
            for members in mesh.groups(group):
                for p, r in enumerate(members):
                    mask = 1
                    while mask < n:
                        want[r, members[p ^ mask]] += M
                        mask <<= 1
            np.testing.assert_array_equal(s.bytes, want, err_msg=f"tree all_reduce group={group}")

        cluster.reset_stats()
        cluster.run(barrier_only, group)
        assert cluster.stats().total_bytes == 0  # a barrier moves 0-byte tokens only


def barrier_only(dev, group):
    dev.barrier(group=group)


def test_contract_check_costs_control_bytes_only(cluster):
    """check_collectives=True vs False: identical data bytes and messages, and no control bytes
    either: calls that agree are checked by digests in shared memory at a fence, not by messages."""
    mesh = cluster.mesh
    cases = [dict(coll="all_reduce", group=g, dtype="float64", algorithm="ring", op="sum", shape=(48,),
                  seed=9)
             for g in groups_of(mesh)]
    cases += [dict(coll="all_gather", group=g, dtype="int64", algorithm="ring", shape=(6,), dim=0, seed=10)
              for g in groups_of(mesh)]
    cluster.reset_stats()
    checked_results = cluster.run(run_cases, cases)
    checked = cluster.stats()
    with VirtualCluster(mesh, check_collectives=False, timeout=TIMEOUT) as plain:
        plain_results = plain.run(run_cases, cases)
        unchecked = plain.stats()
    np.testing.assert_array_equal(checked.bytes, unchecked.bytes)
    np.testing.assert_array_equal(checked.messages, unchecked.messages)
    assert unchecked.control_bytes == 0
    assert checked.control_bytes == 0
    for a, b in zip(checked_results, plain_results):
        assert [x[0].tobytes() for x in a] == [x[0].tobytes() for x in b]


# -- properties on a 4-device cluster ------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster4():
    with VirtualCluster(4, timeout=TIMEOUT) as c:
        yield c


def scatter_then_gather(dev, case: dict) -> np.ndarray:
    x = make_input(case, case["root"], case["root"]) if dev.rank == case["root"] else None
    piece = dev.scatter(x, root=case["root"], dim=case["dim"])
    return dev.all_gather(piece, dim=case["dim"], algorithm=case["algorithm"])


def reduce_scatter_then_gather(dev, case: dict) -> tuple[np.ndarray, np.ndarray]:
    x = make_input(case, dev.rank, dev.rank)
    rs = dev.reduce_scatter(x, dim=case["dim"], op=case["op"])
    return dev.all_gather(rs, dim=case["dim"], algorithm=case["algorithm"]), dev.all_reduce(x, op=case["op"])


def agreeing_collectives(dev, case: dict) -> list[np.ndarray]:
    x = make_input(case, dev.rank, dev.rank)
    return [dev.all_reduce(x, op=case["op"], algorithm=a) for a in ALGORITHMS["all_reduce"]] + [
        dev.all_gather(x, dim=0, algorithm=a) for a in ALGORITHMS["all_gather"]] + [
        dev.broadcast(x if dev.rank == case["root"] else None, root=case["root"])]


shapes = st.lists(st.integers(0, 9), min_size=1, max_size=3).map(tuple)


@settings(max_examples=15, deadline=None)
@given(shape=shapes, data=st.data(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31),
       algorithm=st.sampled_from(sorted(ALGORITHMS["all_gather"])))
def test_scatter_then_all_gather_is_identity(cluster4, shape, data, dtype, seed, algorithm):
    case = dict(shape=shape, dtype=dtype, seed=seed, algorithm=algorithm,
                dim=data.draw(st.integers(0, len(shape) - 1), label="dim"),
                root=data.draw(st.integers(0, 3), label="root"))
    x = make_input(case, case["root"], case["root"])
    for got in cluster4.run(scatter_then_gather, case):
        assert got.shape == x.shape and got.dtype == x.dtype and got.tobytes() == x.tobytes(), case


@settings(max_examples=15, deadline=None)
@given(shape=shapes, data=st.data(), op=st.sampled_from(["sum", "prod", "max", "min"]),
       seed=st.integers(0, 2**31), algorithm=st.sampled_from(sorted(ALGORITHMS["all_gather"])))
def test_reduce_scatter_then_all_gather_is_all_reduce(cluster4, shape, data, op, seed, algorithm):
    case = dict(shape=shape, dtype="int64", op=op, seed=seed, algorithm=algorithm,
                dim=data.draw(st.integers(0, len(shape) - 1), label="dim"))
    want = reference.all_reduce([make_input(case, r, r) for r in range(4)], op=op)[0]
    for rank, (composed, direct) in enumerate(cluster4.run(reduce_scatter_then_gather, case)):
        np.testing.assert_array_equal(composed, direct, err_msg=f"rank {rank} {case}")
        np.testing.assert_array_equal(direct, want, err_msg=f"rank {rank} {case}")
        assert composed.shape == want.shape and composed.dtype == want.dtype


@settings(max_examples=15, deadline=None)
@given(shape=shapes.filter(lambda s: len(s) >= 1), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31),
       op=st.sampled_from(OPS), root=st.integers(0, 3))
def test_results_identical_on_every_device(cluster4, shape, dtype, seed, op, root):
    if dtype == "int64" and op == "avg":
        op = "sum"
    case = dict(shape=shape, dtype=dtype, seed=seed, op=op, root=root)
    results = cluster4.run(agreeing_collectives, case)
    for k in range(len(results[0])):
        assert len({r[k].tobytes() for r in results}) == 1, f"result #{k} differs across devices for {case}"


# -- group spellings --------------------------------------------------------------------------------
def _group_spellings(dev):
    x = np.full(3, float(dev.rank))
    sums = [float(dev.all_reduce(x, group=g)[0]) for g in ("tp", ("tp",), ["tp"], None, ("dp", "tp"),
                                                           ["tp", "dp"], "tp")]
    errors = []
    for _ in range(2):  # a bad spelling is never kept: it fails every time
        try:
            dev.all_reduce(x, group=("tp", "pp"))
        except ValueError as exc:
            errors.append(str(exc))
    return sums, errors, sorted(map(repr, dev._groups))


def test_every_spelling_of_a_group_resolves_to_the_same_ranks_and_hashable_ones_are_kept():
    with VirtualCluster(Mesh({"dp": 2, "tp": 2}), timeout=TIMEOUT) as c:
        for rank, (sums, errors, kept) in enumerate(c.run(_group_spellings)):
            dp = rank // 2
            assert sums == [4.0 * dp + 1] * 3 + [6.0] * 3 + [4.0 * dp + 1]
            assert len(errors) == 2 and all("'pp'" in e for e in errors)
            assert kept == sorted(map(repr, ["tp", ("tp",), None, ("dp", "tp")]))  # lists are not hashable
