"""Shared fixtures.  ``no_leaks`` fails a test that leaves a process, fd, thread or /dev/shm entry
behind (see virtualpar/testing/leaks.py for what counts).  The run's ``tmp_path`` folders live in a
folder of its own, removed when the run ends."""

from __future__ import annotations

import gc
import shutil
import tempfile

import pytest

from virtualpar.testing.leaks import Snapshot, leaks

_OWN_BASETEMP = pytest.StashKey[str]()


def pytest_configure(config):
    """Without ``--basetemp``, pytest keeps its last three runs' ``tmp_path`` folders under
    ``/tmp/pytest-of-<user>``; the suite leaves ``/tmp`` as it found it, so it takes a folder of its
    own and removes it at the end (xdist's workers get sub-folders of it from the controller)."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = config.stash[_OWN_BASETEMP] = tempfile.mkdtemp(prefix="virtualpar-tests-")


def pytest_unconfigure(config):
    if _OWN_BASETEMP in config.stash:
        shutil.rmtree(config.stash[_OWN_BASETEMP], ignore_errors=True)


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves processes, fds, threads or /dev/shm entries behind."""
    gc.collect()
    before = Snapshot.take()
    yield before
    problems = leaks(before, settle=3.0)
    if problems:
        pytest.fail("resources leaked by this test:\n  " + "\n  ".join(problems), pytrace=False)


@pytest.fixture(params=[False, True], ids=["member by member", "strided rows"])
def strided(request, monkeypatch):
    """Both ways the shared-memory collectives read their members' scratch: from how many members
    on they read it as strided rows is a matter of speed (``STRIDED_MIN_MEMBERS`` of
    ``collectives.shm`` and ``collectives.shm_copy``), so tests on small groups take both (forked
    devices inherit the setting)."""
    from virtualpar.collectives import shm, shm_copy

    for module in (shm, shm_copy):
        monkeypatch.setattr(module, "STRIDED_MIN_MEMBERS", 2 if request.param else 1 << 30)
    return request.param
