"""The virtualpar pytest plugin: a started cluster as a fixture, SPMD tests, leak checks, reports.

* ``cluster`` fixture: a started :class:`~virtualpar.VirtualCluster`, closed at teardown.  Its mesh
  and options come from ``@pytest.mark.cluster(mesh, **options)`` or from an indirect parameter
  (``@pytest.mark.parametrize("cluster", [{"mesh": 4}], indirect=True)``); default: 2 devices.
* ``@pytest.mark.spmd(mesh, **options)``: the test body runs on every device, ``def test_x(dev):``
  (other fixture values are passed to every device, so they must pickle).  A failure names the
  device (rank, mesh coordinates) with its remote traceback.
* After every test that started a cluster (itself, or through a fixture or ``spmd``): no child
  process, thread, /dev/shm segment, file descriptor or stray /tmp/pymp-* directory may be left (a leak fails
  the test at teardown; see :mod:`.leaks` for what counts); ``--vp-no-leak-check`` turns this off.  Tests that
  start no cluster are not checked: the plugin loads wherever virtualpar is installed, and another
  project's tests are not its business.  A test that uses a module- or session-scoped fixture is
  compared with the state after its set-up (those fixtures' own resources outlive it by design),
  others with the state before it.
* A failed test that used a cluster gets a ``virtualpar`` report section: the failing device, the
  text timeline of the failed run and every device's flight-recorder tail; with
  ``--vp-keep-traces DIR`` the section and the run's trace (Chrome JSON) are also written there.
* ``--vp-timeout S``: the op timeout of clusters the plugin starts (default 30 s; deadlocks are
  detected long before it).

Everything is per test item and per process, so ``-x``, ``-k`` and ``pytest-xdist`` work without
cross-talk: each worker checks only its own children and segments.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

from ..errors import UsageError
from ..runtime.cluster import VirtualCluster, clusters_created
from .leaks import Snapshot, leaks
from .report import failure_report

__all__ = ["cluster", "dev", "DEFAULT_TIMEOUT", "DEFAULT_MESH"]

DEFAULT_TIMEOUT = 30.0
DEFAULT_MESH = 2
_CLUSTERS = pytest.StashKey[list]()
_BEFORE = pytest.StashKey[Snapshot]()
_CREATED = pytest.StashKey[int]()  # clusters_created() when the test's set-up began


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("virtualpar", "virtualpar: testing parallel code")
    group.addoption("--vp-timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                    help=f"op timeout of the clusters the plugin starts (default {DEFAULT_TIMEOUT:g})")
    group.addoption("--vp-keep-traces", default=None, metavar="DIR",
                    help="write the report and the trace (Chrome JSON) of every failed "
                         "virtualpar test into DIR")
    group.addoption("--vp-no-leak-check", action="store_true", default=False,
                    help="do not fail tests that start a cluster and leave processes, "
                         "threads, shared memory or "
                         "file descriptors behind")


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers",
                            "cluster(mesh=2, **options): the VirtualCluster the `cluster` fixture starts")
    config.addinivalue_line("markers",
                            "spmd(mesh=2, **options): run the test body on every device (def test_x(dev))")


def _options(item: Any, marker: str, param: Any = None) -> tuple[Any, dict]:
    kw: dict = {}
    m = item.get_closest_marker(marker)
    if m is not None:
        if len(m.args) > 1:
            raise UsageError(f"@pytest.mark.{marker} takes the mesh as its only positional "
                             f"argument, got {m.args!r}")
        kw.update(m.kwargs)
        if m.args:
            kw["mesh"] = m.args[0]
    if param is not None:
        if not isinstance(param, dict):
            raise UsageError(f"a `cluster` parameter must be a dict of VirtualCluster options, got {param!r}")
        kw.update(param)
    mesh = kw.pop("mesh", DEFAULT_MESH)
    kw.setdefault("timeout", item.config.getoption("vp_timeout"))
    return mesh, kw


def _start(item: Any, mesh: Any, kw: dict) -> VirtualCluster:
    c = VirtualCluster(mesh, **kw)
    item.stash.setdefault(_CLUSTERS, []).append(c)
    return c


@pytest.fixture
def cluster(request: Any) -> Any:
    """A started VirtualCluster (mesh and options from ``@pytest.mark.cluster`` or the parameter)."""
    mesh, kw = _options(request.node, "cluster", getattr(request, "param", None))
    c = _start(request.node, mesh, kw)
    yield c
    c.close()


@pytest.fixture
def dev(request: Any) -> None:
    """Stands for the device in ``@pytest.mark.spmd`` tests (the plugin runs the body on every device)."""
    if request.node.get_closest_marker("spmd") is None:
        raise UsageError("the `dev` argument is given only to tests marked @pytest.mark.spmd(mesh=...)")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: Any) -> bool | None:
    if pyfuncitem.get_closest_marker("spmd") is None:
        return None
    mesh, kw = _options(pyfuncitem, "spmd")
    c = _start(pyfuncitem, mesh, kw)
    names = [n for n in pyfuncitem._fixtureinfo.argnames if n != "dev"]
    c.run(pyfuncitem.obj, **{n: pyfuncitem.funcargs[n] for n in names})
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: Any) -> Any:
    if item.get_closest_marker("cluster") is not None and "cluster" not in getattr(item, "fixturenames", ()):
        raise UsageError(f"{item.nodeid}: @pytest.mark.cluster configures the `cluster` "
                         "fixture, which this test "
                         "does not take (add a `cluster` argument), so no cluster would start")
    check = not item.config.getoption("vp_no_leak_check")
    if check:
        item.stash[_BEFORE] = Snapshot.take()
        item.stash[_CREATED] = clusters_created()
    result = yield
    if check and _has_wider_fixtures(item):
        item.stash[_BEFORE] = Snapshot.take()  # module/session fixtures set up now outlive this test
    return result


def _has_wider_fixtures(item: Any) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) if info is not None else {}
    return any(d.scope != "function" for ds in defs.values() for d in ds)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    rep = yield
    clusters = item.stash.get(_CLUSTERS, [])
    if rep.when == "call" and rep.failed and clusters:
        err = call.excinfo.value if call.excinfo is not None else None
        text = failure_report(clusters, err)
        rep.sections.append(("virtualpar", text))
        keep = item.config.getoption("vp_keep_traces")
        if keep:
            _keep(keep, item.nodeid, text, clusters)
    return rep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: Any, nextitem: Any) -> Any:
    try:
        result = yield
    finally:
        for c in item.stash.get(_CLUSTERS, []):
            c.close()  # SPMD clusters, and fixtures' if teardown failed before closing them
        item.stash[_CLUSTERS] = []
    before = item.stash.get(_BEFORE, None)
    if before is not None and clusters_created() != item.stash[_CREATED]:
        found = leaks(before)
        if found:
            pytest.fail(f"{item.nodeid} leaked:\n  " + "\n  ".join(found), pytrace=False)
    return result


def _keep(directory: str, nodeid: str, text: str, clusters: list) -> None:
    os.makedirs(directory, exist_ok=True)
    stem = os.path.join(directory, re.sub(r"[^\w.-]+", "_", nodeid).strip("_"))
    with open(stem + ".txt", "w") as f:
        f.write(text + "\n")
    for k, c in enumerate(clusters):
        if not c.closed:
            try:
                # what Perfetto opens (save_json is virtualpar's own)
                c.trace().write_chrome(f"{stem}.{k}.json")
            except Exception as exc:  # never hide the test's failure
                with open(stem + ".txt", "a") as f:
                    f.write(f"(trace of cluster {k} not saved: {exc})\n")
