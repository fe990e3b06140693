"""Collective calls at the edges of their arguments: dtypes a reduction is not defined on, a
float16 average whose sum would overflow, spellings of one call that must agree, and arguments
of the wrong type, each named in the call's own words."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster
from virtualpar.collectives import reference
from virtualpar.errors import CollectiveMismatch, UsageError

TIMEOUT = 20.0


@pytest.mark.parametrize("algorithm", [None, "ring", "tree", "direct", "shm"])
def test_a_float16_average_does_not_overflow_where_its_mean_fits(algorithm):
    """30000 on each of 3 devices: the sum (90000) is past float16's 65504; each input is divided
    by n first (NCCL's PreMulSum), as the oracle's mean never overflows."""
    with VirtualCluster(3, timeout=TIMEOUT) as c:
        got = c.run(lambda dev: dev.all_reduce(np.full(4, 30000, np.float16), op="avg", algorithm=algorithm))
        rs = c.run(lambda dev: dev.reduce_scatter(np.full(6, 30000, np.float16), op="avg"))
    want = reference.all_reduce([np.full(4, 30000, np.float16)] * 3, op="avg")[0]
    for g in got:
        assert g.dtype == np.float16 and np.isfinite(g).all()
        np.testing.assert_allclose(g.astype(np.float32), want.astype(np.float32), rtol=2e-3)
    assert all(np.isfinite(p).all() and p.size == 2 for p in rs)
    assert all(np.array_equal(g, got[0]) for g in got)  # still bit-identical across the group


@pytest.mark.parametrize("x, op, said", [
    (np.array(["a", "bb"]), "sum", r"reduce op 'sum' is not defined on dtype <U2"),
    (np.array(["2020-01-01"], "datetime64[D]"), "sum",
     r"reduce op 'sum' is not defined on dtype datetime64\[D\]"),
    (np.array([1, 2], "timedelta64[s]"), "prod",
     r"reduce op 'prod' is not defined on dtype timedelta64\[s\]"),
    (np.array([True, False]), "avg", r"the average of bool values is not one"),
])
def test_a_reduction_on_a_dtype_it_is_not_defined_on_is_refused_by_name(x, op, said):
    """Strings came back concatenated and truncated ('aa') from three algorithms and failed inside
    numpy in the fourth; dates failed inside an algorithm after data had moved."""
    with VirtualCluster(3, timeout=TIMEOUT) as c:
        for algorithm in ("ring", "shm"):
            with pytest.raises(UsageError, match=rf"device \d \(world=\d\): all_reduce on group .*: {said}"):
                c.run(lambda dev: dev.all_reduce(x, op=op, algorithm=algorithm))
        ok = c.run(lambda dev: dev.all_reduce(np.array([1, 2], "timedelta64[s]"), op="max"))
        # failed inside shm
        one = c.run(lambda dev: dev.all_reduce(np.array([dev.rank + 1], "timedelta64[s]")))
        late = c.run(lambda dev: dev.all_reduce(np.array([f"2020-01-0{dev.rank + 1}"], "datetime64[D]"),
                                                op="max"))
    assert ok[0].tolist() == np.array([1, 2], "timedelta64[s]").tolist()
    assert one[0] == np.array([6], "timedelta64[s]") and late[0] == np.array(["2020-01-03"], "datetime64[D]")


def test_one_call_spelled_two_ways_is_one_call():
    """np.int64(0) against 0 for a root-only dim, and np.str_('sum') against 'sum', were reported
    as a CollectiveMismatch whose listing showed identical calls."""
    def spelled(dev):
        dim = np.int64(0) if dev.rank == 0 else 0
        piece = dev.scatter(np.arange(8.0).reshape(4, 2) if dev.rank == 0 else None, root=0, dim=dim)
        op = np.str_("sum") if dev.rank == 0 else "sum"
        return piece.tolist(), dev.all_reduce(np.ones(2), op=op).tolist()

    with VirtualCluster(2, timeout=TIMEOUT) as c:
        assert c.run(spelled) == [([[0.0, 1.0], [2.0, 3.0]], [2.0, 2.0]),
                                  ([[4.0, 5.0], [6.0, 7.0]], [2.0, 2.0])]
        with pytest.raises(CollectiveMismatch):  # a real difference is still one
            c.run(lambda dev: dev.all_reduce(np.ones(2), op="sum" if dev.rank else "max"))


@pytest.mark.parametrize("call, said", [
    (lambda dev: dev.all_reduce(np.ones(2), algorithm=["ring"]), r"unknown algorithm \['ring'\]"),
    (lambda dev: dev.broadcast(np.ones(2), root=1.0),
     r"root=1.0 is not an int; root is a position in the group, 0..1"),
    (lambda dev: dev.all_reduce(np.ones(2), op="SUM"), r"all_reduce on group .*: unknown reduce op 'SUM'"),
    (lambda dev: dev.all_reduce(np.ones(2), timeout="5"), r"timeout must be"),
    (lambda dev: dev.all_reduce(np.ones(2), timeout=True), r"timeout must be"),
    (lambda dev: dev.send(np.ones(2), 1 - dev.rank, tag=2 ** 64), r"tag must be an int in 0..2\*\*63-1"),
])
def test_arguments_of_the_wrong_type_are_named(call, said):
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        with pytest.raises(UsageError, match=said):
            c.run(call)


def test_a_structured_array_is_refused_as_what_it_is():
    """The message said 'use send() for objects' of an array that holds no objects."""
    from virtualpar.errors import PayloadError

    rec = np.zeros(2, dtype=[("a", "f8"), ("b", "i4")])
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        with pytest.raises(PayloadError,
                           match=r"arrays of a structured dtype .* send\(\) and recv\(\) move them pickled"):
            c.run(lambda dev: dev.all_gather(rec))
        got = c.run(lambda dev: (dev.send(rec, 1 - dev.rank), dev.recv(1 - dev.rank))[1])
    assert all(g.dtype == rec.dtype for g in got)


def test_a_direct_all_reduce_the_machine_cannot_hold_is_refused_before_it_moves_a_byte(monkeypatch):
    """Every member of a direct all_reduce holds the other n−1 arrays at once: 128 devices reducing
    512 KiB took more than this machine's 24 GiB and the kernel killed a device.  The devices are
    forked after the patch, so each sees a 1 MiB machine: 4 members of 64 KiB need ~2.3 MiB and
    are refused alike, by name; 8 bytes pass, and so does the default algorithm at 64 KiB."""
    from virtualpar.collectives import direct
    monkeypatch.setattr(direct, "MACHINE_BYTES", 1 << 20)
    with VirtualCluster(4, timeout=TIMEOUT) as c:
        with pytest.raises(UsageError,
                           match=r"device \d \(world=\d\): all_reduce on group .*: algorithm 'direct' would "
                                             r"hold ~2.2 MiB at once \(each of 4 devices keeps 3 arrays "
                                             r"of 65536 bytes .* more than 80% of this machine's "
                                             r"1.0 MiB; use the default"):
            c.run(lambda dev: dev.all_reduce(np.ones(8192), algorithm="direct"))
        small = c.run(lambda dev: dev.all_reduce(np.ones(1), algorithm="direct"))
        large = c.run(lambda dev: dev.all_reduce(np.ones(8192)))
    assert [s.tolist() for s in small] == [[4.0]] * 4
    assert all((y == 4).all() for y in large)
    # the case that was killed is refused
    assert direct.HELD_PER_TERM * 128 * 127 * (512 << 10) > 0.8 * (24 << 30)
    # the groups of a mesh axis call together: pairs on 4 devices hold 3 * 4 * 1 * 64 KiB = 768 KiB in all
    monkeypatch.setattr(direct, "MACHINE_BYTES", 800 << 10)
    with VirtualCluster(Mesh({"a": 2, "b": 2}), timeout=TIMEOUT) as c:
        with pytest.raises(UsageError,
                           match=r"on group b=.*would hold ~0.8 MiB at once \(each of 4 "
                                 r"devices keeps 1 array "):
            c.run(lambda dev: dev.all_reduce(np.ones(8192), group="b", algorithm="direct"))


@pytest.mark.parametrize("files, limit", [
    ({"/proc/self/cgroup": "0::/job\n", "/sys/fs/cgroup/job/memory.max": "1073741824\n"}, 1 << 30),  # v2
    ({"/proc/self/cgroup": "0::/job\n", "/sys/fs/cgroup/job/memory.max": "max\n"}, None),  # v2, no limit
    ({"/proc/self/cgroup": "4:memory:/api/x\n1:cpu:/\n",
      "/sys/fs/cgroup/memory/api/x/memory.limit_in_bytes": "2147483648"},
     2 << 30),  # v1
    ({}, None),  # no /proc
])
def test_the_machine_memory_is_the_lower_of_ram_and_the_cgroup_limit(monkeypatch, files, limit):
    import io
    import os

    from virtualpar.collectives import direct

    def fake_open(path, *args, **kwargs):
        if path not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[path])

    monkeypatch.setattr(direct, "open", fake_open, raising=False)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert direct._machine_bytes() == (ram if limit is None else min(ram, limit))
