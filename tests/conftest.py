"""Shared fixtures.  ``no_leaks`` fails a test that leaves a process, fd, thread or /dev/shm entry
behind (see virtualpar/testing/leaks.py for what counts)."""

from __future__ import annotations

import gc

import pytest

from virtualpar.testing.leaks import Snapshot, leaks


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
