"""VirtualCluster lifecycle on real device processes: run, state, identity, host channels, stats,
clocks, start methods, and the minimum failure behaviour (errors carry rank, index and traceback).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import virtualpar
from virtualpar import Mesh, MeshIndex, VirtualChannel, VirtualCluster, VirtualDevice
from virtualpar.errors import ClusterClosedError, DeviceError, PayloadError, UsageError

from . import _device_fns

TIMEOUT = 20.0
MESH = Mesh({"dp": 2, "tp": 4})
MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster():
    with VirtualCluster(MESH, timeout=TIMEOUT) as c:
        yield c


# -- running code ------------------------------------------------------------------------------------
def whoami(dev) -> dict[str, Any]:
    return {"rank": dev.rank, "size": dev.size, "index": dev.index, "mesh": dev.mesh,
            "pid": os.getpid(), "type": type(dev).__name__, "is_device": isinstance(dev, VirtualDevice)}


def test_identity_on_a_2x4_mesh(cluster):
    got = cluster.run(whoami)
    assert [g["rank"] for g in got] == list(range(8))
    for r, g in enumerate(got):
        assert g["size"] == 8 and g["mesh"] == MESH and g["is_device"]
        assert isinstance(g["index"], MeshIndex)
        assert g["index"] == MESH.index(r) == (r // 4, r % 4)
        assert (g["index"].dp, g["index"]["tp"]) == (r // 4, r % 4)
        assert str(g["index"]) == f"(dp={r // 4}, tp={r % 4})"
    pids = [g["pid"] for g in got]
    assert len(set(pids)) == 8 and os.getpid() not in pids and pids == cluster.pids


def set_state(dev, base: int) -> None:
    dev.state["w"] = np.full(3, base + dev.rank)
    dev.state["runs"] = dev.state.get("runs", 0) + 1


def read_state(dev) -> tuple[np.ndarray, int]:
    return dev.state["w"], dev.state["runs"]


def test_state_persists_across_runs(cluster):
    before = cluster.run(whoami)
    cluster.run(set_state, 100)
    cluster.run(set_state, 200)
    for r, (w, runs) in enumerate(cluster.run(read_state)):
        np.testing.assert_array_equal(w, np.full(3, 200 + r))
        assert runs >= 2
    assert [g["pid"] for g in cluster.run(whoami)] == [g["pid"] for g in before]  # the same processes


def last_one_home(dev) -> int:
    """Rank 0 returns last: it waits for a message from every other device first."""
    if dev.rank == 0:
        return sum(dev.recv(src) for src in range(1, dev.size))
    dev.send(dev.rank, 0)
    return dev.rank * 1000


def test_results_come_back_in_rank_order(cluster):
    assert cluster.run(last_one_home) == [sum(range(1, 8))] + [r * 1000 for r in range(1, 8)]


def with_kwargs(dev, a, b=0, *, scale=1) -> tuple:
    return dev.rank, a, b, scale


def test_args_and_kwargs_are_passed(cluster):
    got = cluster.run(with_kwargs, "x", b=np.arange(2), scale=3)
    for r, (rank, a, b, scale) in enumerate(got):
        assert (rank, a, scale) == (r, "x", 3)
        np.testing.assert_array_equal(b, np.arange(2))
    assert cluster.run(with_kwargs, 5)[7] == (7, 5, 0, 1)
    # run's own argument names pass through
    assert cluster.run(named_like_run, fn="f", op="o")[0] == ("f", "o")


def named_like_run(dev, fn, op):
    return fn, op


# -- host <-> device channels -----------------------------------------------------------------------
def double_state(dev, key: str, out_key: str) -> str | None:
    if key not in dev.state:  # only the device the driver put it on holds it
        return None
    dev.state[out_key] = dev.state[key] * 2
    return str(dev.state[key].dtype)


@pytest.mark.parametrize("nbytes", [8, 4096, 8 * MiB], ids=["8B", "4KiB", "8MiB"])
def test_put_get_round_trip_and_host_traffic_is_counted_apart(cluster, nbytes):
    rank = 5
    x = np.arange(nbytes // 8, dtype=np.float64) + 0.5
    cluster.reset_stats()
    cluster.put(rank, "x", x)
    after_put = cluster.stats()
    assert cluster.run(double_state, "x", "y") == [None] * rank + ["float64"] + [None] * (7 - rank)
    y = cluster.get(rank, "y")
    x_back = cluster.get(rank, "x")
    s = cluster.stats()
    np.testing.assert_array_equal(x_back, x)
    np.testing.assert_array_equal(y, x * 2)
    assert y.dtype == x.dtype and y.shape == x.shape
    want_in = np.zeros(8, np.int64)
    want_in[rank] = x.nbytes
    np.testing.assert_array_equal(after_put.host_to_device, want_in)
    np.testing.assert_array_equal(s.host_to_device, want_in)
    want_out = np.zeros(8, np.int64)
    want_out[rank] = 2 * x.nbytes
    np.testing.assert_array_equal(s.device_to_host, want_out)
    assert s.total_bytes == 0 and not s.bytes.any(), "host traffic leaked into device-to-device bytes"


def test_put_get_of_python_objects_and_every_rank(cluster):
    for r in range(8):
        cluster.put(r, "cfg", {"rank": r, "layers": [1, 2, 3]})
    assert [cluster.get(r, "cfg") for r in range(8)] == [{"rank": r, "layers": [1, 2, 3]} for r in range(8)]


def test_get_of_a_missing_key_names_it(cluster):
    cluster.put(0, "cfg", {"rank": 0})
    # an earlier op must not be blamed: the get is the caller's mistake
    cluster.run(lambda dev: dev.barrier())
    with pytest.raises(UsageError, match=r"^cluster.get\(0, 'no_such_key'\): device 0 \(.*\) has no "
                                         r"state\['no_such_key'\]; it holds \[.*'cfg'.*\]$") as exc:
        cluster.get(0, "no_such_key")
    assert exc.value.rank == 0
    assert cluster.get(0, "cfg")["rank"] == 0  # still usable


# -- clocks ---------------------------------------------------------------------------------------------
def big_all_reduce(dev) -> None:
    dev.all_reduce(np.ones(1 << 18, np.float32))


def test_clocks_one_float_per_device_and_advancing(cluster):
    before = cluster.clocks()
    assert len(before) == 8 and all(isinstance(c, float) for c in before)
    cluster.run(big_all_reduce)
    after = cluster.clocks()
    assert len(after) == 8 and all(isinstance(c, float) for c in after)
    assert all(a > b >= 0.0 for a, b in zip(after, before)), (before, after)


# -- the public names ------------------------------------------------------------------------------------
def test_public_names_importable_from_virtualpar():
    from virtualpar.mesh import Mesh as M, MeshIndex as MI
    from virtualpar.runtime import VirtualCluster as VC, VirtualDevice as VD
    from virtualpar.transport.channel import VirtualChannel as CH

    assert (Mesh, MeshIndex, VirtualCluster, VirtualDevice, VirtualChannel) == (M, MI, VC, VD, CH)
    for name in ("Mesh", "MeshIndex", "VirtualCluster", "VirtualDevice", "VirtualChannel"):
        assert name in virtualpar.__all__ and hasattr(virtualpar, name)


# -- start methods ------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_each_start_method_runs_collectives(method):
    n = 3
    want = sum(np.arange(5, dtype=np.int64) + r for r in range(n))
    with VirtualCluster(n, start_method=method, timeout=TIMEOUT) as c:
        assert c.start_method == method
        for algorithm in ("ring", "tree", "direct"):
            got = c.run(_device_fns.rank_all_reduce, algorithm)
            assert [g[0] for g in got] == list(range(n))
            assert len({g[1] for g in got} | {os.getpid()}) == n + 1
            for _, _, y in got:
                np.testing.assert_array_equal(y, want)
        assert c.run(_device_fns.ring_pass) == [((r - 1) % n) * 10 for r in range(n)]


# -- failures ------------------------------------------------------------------------------------------
def test_an_unpicklable_argument_is_a_clear_error_not_a_hang(cluster):
    with pytest.raises(PayloadError, match="argument 0 \\(generator\\).*picklable"):
        cluster.run(with_kwargs, (i for i in range(3)))
    assert cluster.run(lambda dev: dev.rank)[:2] == [0, 1]  # functions from anywhere: cloudpickle
    assert cluster.run(with_kwargs, 1)[0] == (0, 1, 0, 1)


def fail_on_rank_6(dev) -> int:
    if dev.rank == 6:
        raise ZeroDivisionError("boom on purpose")
    if dev.rank in (2, 7):
        return dev.recv(6)  # blocked on the failing device: must be woken, not left to time out
    return dev.rank


def test_an_exception_on_a_device_carries_rank_index_and_traceback(cluster):
    with pytest.raises(DeviceError, match="boom on purpose") as info:
        cluster.run(fail_on_rank_6)
    err = info.value
    assert err.rank == 6 and err.index == str(MESH.index(6)) and err.exc_type == "ZeroDivisionError"
    assert "ZeroDivisionError" in str(err.__cause__) and "fail_on_rank_6" in str(err.__cause__)
    assert cluster.run(with_kwargs, 2)[6] == (6, 2, 0, 1)  # every device came back: still usable


def test_exit_reaps_every_process_and_closes_the_cluster():
    with VirtualCluster(4, timeout=TIMEOUT) as c:
        pids = list(c.pids)
        assert c.run(_device_fns.ring_pass) == [30, 0, 10, 20]
    assert c.closed
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(ClusterClosedError):
        c.run(_device_fns.ring_pass)


def test_a_cluster_dropped_without_close_is_closed_with_a_warning():
    """Its devices lived on until the driver exited (a notebook re-running a cell piled them up)."""
    import gc
    import warnings

    from virtualpar.testing.leaks import process_alive

    c = VirtualCluster(2, timeout=TIMEOUT)
    pids = list(c.pids)
    assert c.run(_device_fns.ring_pass) == [10, 0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del c
        gc.collect()
    assert any(issubclass(w.category,
                          ResourceWarning) and "was never closed; it was closed when "
                                               "collected" in str(w.message)
               for w in caught)
    assert not any(process_alive(p) for p in pids)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the raised warning itself
def test_a_dropped_cluster_is_closed_even_when_warnings_are_errors():
    """The finalizer warned first: under -W error the warning raised and nothing closed the devices."""
    import gc
    import warnings

    from virtualpar.testing.leaks import process_alive

    c = VirtualCluster(2, timeout=TIMEOUT)
    pids = list(c.pids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del c
        gc.collect()
    assert not any(process_alive(p) for p in pids)


def _blas_threads(dev):
    from threadpoolctl import threadpool_info

    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_devices_share_the_cores_between_their_blas_threads():
    import os as _os

    cores = len(_os.sched_getaffinity(0))
    driver = _blas_threads(None)
    with VirtualCluster(4) as c:
        per_device = c.run(_blas_threads)
    assert all(threads and max(threads) == max(1, cores // 4) for threads in per_device)
    assert _blas_threads(None) == driver  # the driver found the libraries before forking, and limited nothing


def test_a_spawned_script_without_a_main_guard_gets_a_named_error_and_leaks_nothing(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "no_guard.py"
    script.write_text("from virtualpar import VirtualCluster\n"
                      "with VirtualCluster(2, start_method='spawn') as c:\n"
                      "    c.run(lambda dev: dev.rank)\n")
    before = {f for f in os.listdir("/dev/shm") if f.startswith("virtualpar-")}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode != 0
    # each device says why
    assert "if __name__ == \"__main__\":" in proc.stderr and "UsageError" in proc.stderr
    assert "DeviceDied" in proc.stderr  # and the driver names the device that did not start
    assert {f for f in os.listdir("/dev/shm") if f.startswith("virtualpar-")} <= before
