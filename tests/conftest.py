"""Shared fixtures.  ``no_leaks`` fails a test that leaves a process, fd, thread or /dev/shm entry
behind (see tests/_leaks.py for what counts)."""

from __future__ import annotations

import gc

import pytest

from ._leaks import Snapshot, wait_for_no_leaks


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves processes, fds, threads or /dev/shm entries behind."""
    gc.collect()
    before = Snapshot.take()
    yield before
    problems = wait_for_no_leaks(before)
    if problems:
        pytest.fail("resources leaked by this test:\n  " + "\n  ".join(problems), pytrace=False)
