"""Shared memory at its limits (issue 43): a failed allocation leaves nothing and says why, and a
cluster too large for this machine is refused before anything is allocated, saying how many fit.

Failures are forced in-process (``os.ftruncate`` / ``mmap`` raising ENOMEM) and the machine's
figures are replaced (``sysmem``), so nothing here allocates more than a small cluster."""

from __future__ import annotations

import errno
import multiprocessing
import os
import re
import subprocess
import sys

import pytest

from virtualpar import ResourceLimitError, VirtualCluster, sysmem
from virtualpar.runtime import capacity, cluster as cluster_module
from virtualpar.transport import shm
from virtualpar.transport.shm import Layout, SharedArena


def _ours() -> list[str]:
    return [e for e in os.listdir("/dev/shm") if e.startswith(f"virtualpar-{os.getpid()}-")]


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _enomem(*_args, **_kwargs):
    raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))


@pytest.fixture
def shm_has_123_mib(monkeypatch):
    monkeypatch.setattr(sysmem, "shm_free", lambda path=sysmem.SHM_DIR: 123 << 20)
    monkeypatch.setattr(sysmem, "physical_available", lambda: 5 << 30)


@pytest.mark.parametrize("where", ["ftruncate", "mmap"])
def test_a_failed_allocation_unlinks_and_names_the_size_and_the_space(where, monkeypatch, shm_has_123_mib):
    if where == "ftruncate":
        monkeypatch.setattr(shm.os, "ftruncate", _enomem)
    else:
        monkeypatch.setattr(shm.mmap, "mmap", _enomem)
    fds = _fds()
    with pytest.raises(ResourceLimitError) as info:
        SharedArena.create(3 << 20)
    msg = str(info.value)
    assert "cannot allocate a shared-memory segment of 3 MiB (3145728 bytes): Cannot allocate memory" in msg
    assert "/dev/shm has 123 MiB free and this machine 5 GiB of memory available" in msg
    assert (info.value.requested, info.value.shm_free) == (3 << 20, 123 << 20)
    assert _ours() == [] and _fds() == fds  # neither a name nor a descriptor left


def test_a_cluster_whose_segment_cannot_be_made_starts_no_process(monkeypatch, shm_has_123_mib):
    monkeypatch.setattr(shm.os, "ftruncate", _enomem)
    before = cluster_module.clusters_created()
    with pytest.raises(ResourceLimitError,
                       match=r"cannot allocate a shared-memory segment of .* 123 MiB free"):
        VirtualCluster(2)
    assert cluster_module.clusters_created() == before + 1 and _ours() == []
    assert multiprocessing.active_children() == []  # failed before any device was started


def test_a_segment_larger_than_the_address_space_fails_cleanly_without_allocating():
    """Sizing a tmpfs file is free (it is sparse); mapping 200 TiB fails on a 47-bit address space."""
    try:
        arena = SharedArena.create(200 << 40)
    except ResourceLimitError as exc:
        assert "of 200 TiB" in str(exc) and "free" in str(exc)
    else:  # a machine with 57-bit addresses maps it (untouched, it costs nothing)
        arena.close()
        pytest.skip("this machine maps 200 TiB")
    assert _ours() == []


def _fits_by_hand(shared_cap: int, total_cap: int, files: int, n: int, ring: int = 1 << 20) -> int:
    """The largest k < n with 152·(k+1)² + 16448·k <= shared_cap, that plus 8 MiB·k <= total_cap,
    3k + 64 <= files, and k(k+1) rings within 64 TiB: counted up, not solved."""
    k = 0
    while k + 1 < n:
        j = k + 1
        shared = 152 * (j + 1) ** 2 + 16448 * j
        if shared > shared_cap or shared + j * (8 << 20) > total_cap or 3 * j + 64 > files or \
                j * (j + 1) * ring > 64 << 40:
            break
        k = j
    return k


@pytest.mark.parametrize("shm_free, available, files", [
    (1 << 40, 1 << 30, 1 << 20),  # memory decides: 8 MiB a device
    (1 << 20, 1 << 40, 1 << 20),  # /dev/shm decides: 152 B a pair
    (1 << 40, 1 << 40, 100),  # open files decide
])
def test_too_many_devices_are_refused_before_allocating_with_how_many_fit(monkeypatch, shm_free, available,
                                                                          files):
    monkeypatch.setattr(sysmem, "shm_free", lambda path=sysmem.SHM_DIR: shm_free)
    monkeypatch.setattr(sysmem, "physical_available", lambda: available)
    monkeypatch.setattr(capacity, "_open_files_limit", lambda: files)
    before = cluster_module.clusters_created()
    n = 500
    with pytest.raises(ResourceLimitError) as info:
        VirtualCluster(n)
    per_ring = Layout(n, 1 << 20, 4 << 20).total_bytes // (n * (n + 1))
    fits = _fits_by_hand(shm_free, available, files, n, ring=per_ring)
    assert info.value.fits == fits and 0 < fits < n
    assert f"a cluster of {n} devices does not fit on this machine" in str(info.value)
    assert f"At most {fits} devices fit" in str(info.value)
    assert cluster_module.clusters_created() == before and _ours() == []  # refused before anything began
    capacity.check_capacity(Layout(fits, 1 << 20, 4 << 20))  # and that many pass


def test_the_sizes_that_run_today_pass_on_this_machine():
    for n in (1, 8, 64, 256):
        capacity.check_capacity(Layout(n, 1 << 20, 4 << 20, 3))


def test_ten_thousand_devices_are_refused_at_once_by_the_address_space_alone(monkeypatch):
    monkeypatch.setattr(sysmem, "shm_free", lambda path=sysmem.SHM_DIR: 1 << 50)
    monkeypatch.setattr(sysmem, "physical_available", lambda: 1 << 50)
    monkeypatch.setattr(capacity, "_open_files_limit", lambda: 1 << 30)
    with pytest.raises(ResourceLimitError,
                       match=r"its shared segment \(95\.4 TiB, mostly a ring of 1 MiB per pair "
                                                 r"of devices\) is more than the 64 TiB .* "
                                                 r"At most 8\d\d\d devices"):
        VirtualCluster(10000)


@pytest.mark.parametrize("argv", [["run", "-n", "10000", "{script}:f"], ["policies", "--mesh", "x=10000"]])
def test_the_commands_refuse_ten_thousand_devices_with_the_message(argv, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("def f(dev):\n    return dev.rank\n")
    argv = [a.format(script=script) for a in argv]
    done = subprocess.run([sys.executable, "-m", "virtualpar", *argv], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert re.search(r"ResourceLimitError: a cluster of 10000 devices does not fit on this machine: .* "
                     r"At most \d+ devices fit", done.stderr), done.stderr
    assert "Traceback" not in done.stderr
