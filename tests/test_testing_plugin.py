"""The pytest plugin (virtualpar/testing/plugin.py), run on example test files with ``pytester``."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

pytest_plugins = ["pytester"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = "virtualpar.testing.plugin"

HEADER = """
import numpy as np
import pytest
from virtualpar import VirtualCluster
"""


@pytest.fixture
def tester(pytester, monkeypatch):
    # this worktree's virtualpar
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return pytester


def _file(pytester, body: str, name: str = "test_example") -> None:
    pytester.makepyfile(**{name: HEADER + textwrap.dedent(body)})


def _plugin_args() -> list[str]:
    """``-p`` the plugin, as the README says one may, whether or not its pytest11 entry point is
    installed too (it is named after the module, so the two are one plugin: loading it by hand
    beside the installed entry point raised 'Plugin already registered under a different name')."""
    return ["-p", PLUGIN]


def _run(pytester, *args):
    return pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", *args)


PASSING = """
def shard_sum(dev, x):
    return dev.all_reduce(x[dev.rank::dev.size].sum(keepdims=True))

@pytest.mark.cluster(mesh=3)
def test_fixture(cluster):
    x = np.arange(30.0)
    assert [float(r[0]) for r in cluster.run(shard_sum, x)] == [x.sum()] * 3

@pytest.mark.parametrize("cluster", [{"mesh": 2}, {"mesh": {"dp": 2, "tp": 2}}], indirect=True)
def test_param(cluster):
    assert cluster.size in (2, 4)

@pytest.mark.spmd(mesh={"dp": 2, "tp": 2})
def test_spmd(dev):
    got = dev.all_reduce(np.full(3, float(dev.rank)))
    np.testing.assert_array_equal(got, np.full(3, 6.0))
    assert dev.index.tp == dev.rank % 2

@pytest.mark.cluster(mesh=2)
def test_timeout_option(cluster):
    assert cluster.config.timeout == 7.5
"""


def test_passing_tests_pass(tester):
    _file(tester, PASSING)
    result = _run(tester, "--vp-timeout", "7.5")
    result.assert_outcomes(passed=5)


FAILING = """
@pytest.mark.spmd(mesh={"dp": 2, "tp": 2})
def test_one_device_wrong(dev):
    y = dev.all_reduce(np.ones(2))
    assert dev.rank != 3, "device 3 disagrees"
"""


def test_a_failing_spmd_test_names_its_device_with_timeline_and_flight_records(tester):
    _file(tester, FAILING)
    result = _run(tester)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "failed on device 3 (dp=1, tp=1): DeviceError" in out
    assert "remote traceback of device 3" in out and "device 3 disagrees" in out
    assert "timeline of the failed run" in out and "legend (by priority)" in out
    assert "flight recorder (last 6 ops per device)" in out and "all_reduce #1" in out


TWO_FAILING = """
@pytest.mark.spmd(mesh={"dp": 2, "tp": 2})
def test_two_devices_wrong(dev):
    dev.all_reduce(np.ones(2))
    assert dev.index.tp == 0, f"tp rank {dev.index.tp} disagrees"
"""


def test_every_device_that_failed_on_its_own_is_reported_with_its_traceback(tester):
    _file(tester, TWO_FAILING)
    result = _run(tester)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    first, other = ("1 (dp=0, tp=1)", "3 (dp=1, tp=1)")
    if f"\nfailed on device {first}" not in out:  # the earlier failure is the root: either may be
        first, other = other, first
    assert f"\nfailed on device {first}: DeviceError" in out
    assert f"also failed on device {other}: DeviceError" in out
    assert "remote traceback of device 1" in out and "remote traceback of device 3" in out
    assert "also failed on device 0" not in out and "also failed on device 2" not in out


LEAKING = """
import os, threading

KEEP = []

def test_leaks_a_cluster():
    KEEP.append(VirtualCluster(2))

def test_leaks_a_forkserver_cluster():  # its devices are the forkserver's children, not ours
    KEEP.append(VirtualCluster(2, start_method="forkserver"))

def test_leaks_a_thread_beside_a_cluster():
    with VirtualCluster(2):
        stop = threading.Event()
        KEEP.append(stop)
        threading.Thread(target=stop.wait, name="left-behind", daemon=True).start()

def test_clean():
    with VirtualCluster(2) as c:
        assert c.size == 2

def test_no_cluster_is_not_checked():  # another project's test: an fd and a thread left are its own business
    KEEP.append(open(os.devnull))
    stop = threading.Event()
    KEEP.append(stop)
    threading.Thread(target=stop.wait, daemon=True).start()
"""


def test_a_leaking_test_fails_at_teardown(tester):
    _file(tester, LEAKING)
    result = _run(tester)
    result.assert_outcomes(passed=5, errors=3)
    out = result.stdout.str()
    assert "ERROR at teardown of test_leaks_a_cluster" in out
    assert "test_example.py::test_leaks_a_cluster leaked" in out and "/dev/shm/virtualpar-" in out
    assert "still running" in out
    forkserver = out[out.index("test_leaks_a_forkserver_cluster "
                               "leaked"):out.index("ERROR at teardown of test_leaks_a_thread")]
    assert forkserver.count("forkserver") >= 2 and forkserver.count("still running") == 2, out  # both devices
    assert (
        "test_leaks_a_thread_beside_a_cluster leaked" in out and "thread 'left-behind' still running" in out
    )
    assert "ERROR at teardown of test_clean" not in out and "ERROR at teardown of test_no_cluster" not in out


DEADLOCKING = """
@pytest.mark.spmd(mesh=2)
def test_both_receive_first(dev):
    dev.recv(1 - dev.rank, tag=0)
    dev.send(np.zeros(1), 1 - dev.rank, tag=0)

@pytest.mark.spmd(mesh=3, eager_limit=0)
def test_unsafe_ring(dev):
    dev.send(np.ones(4), (dev.rank + 1) % 3)
    dev.recv((dev.rank - 1) % 3)
"""


def test_deadlocks_fail_fast_with_the_cycle(tester):
    _file(tester, DEADLOCKING)
    result = _run(tester, "--vp-timeout", "30", "-p", "no:timeout", "--durations=0")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert ("Deadlock: deadlock (a cycle of waits): device 0 waits recv from 1 (tag 0) "
            "← device 1 waits recv from 0 (tag 0)" in out)
    assert ("device 0 waits send to 1 (tag 0) ← device 1 waits send to 2 (tag 0) "
            "← device 2 waits send to 0 (tag 0)" in out)


def test_keep_traces_writes_the_report_and_trace(tester):
    _file(tester, FAILING)
    result = _run(tester, "--vp-keep-traces", "kept")
    result.assert_outcomes(failed=1)
    kept = sorted(os.listdir(tester.path / "kept"))
    assert kept == ["test_example.py_test_one_device_wrong.0.json",
                    "test_example.py_test_one_device_wrong.txt"]
    assert "failed on device 3" in (tester.path / "kept" / kept[1]).read_text()
    doc = json.loads((tester.path / "kept" / kept[0]).read_text())  # Chrome's trace format, for Perfetto
    assert "traceEvents" in doc and any(e.get("ph") == "X" for e in doc["traceEvents"])


def test_x_and_k(tester):
    _file(tester, FAILING + PASSING)
    _run(tester, "-x").assert_outcomes(failed=1)  # stops after the first failure, nothing leaks
    _run(tester, "-k", "test_fixture or test_param").assert_outcomes(passed=3, deselected=3)


def test_xdist_workers_do_not_cross_talk(tester):
    _file(tester, PASSING, "test_a")
    _file(tester, PASSING.replace("def test_", "def test_b_"), "test_b")
    result = _run(tester, "-n", "2", "--vp-timeout", "7.5")
    result.assert_outcomes(passed=10)


def test_a_cluster_marker_on_a_test_without_the_fixture_is_an_error(tester):
    """It was ignored: the test ran with no cluster, whatever the marker asked for."""
    _file(tester, """
import pytest

@pytest.mark.cluster(mesh=4)
def test_forgot_the_argument():
    pass
""")
    result = _run(tester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.cluster configures the `cluster` fixture, which "
                                 "this test does not take*"])
