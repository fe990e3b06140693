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
