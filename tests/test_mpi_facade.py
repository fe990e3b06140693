"""Unmodified mpi4py programs on the emulator print what they print under mpiexec; deadlocks and
calls outside the subset get named errors, not hangs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from ._mpi import run_mpiexec

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_programs")


def _lines(text: str) -> list[str]:
    """Output lines, sorted; mpiexec may glue two ranks' lines together, so split before each 'rank N'."""
    text = re.sub(r"(?<!^)(?<!\n)(rank \d+|gathered)", r"\n\1", text)
    return sorted(line for line in text.splitlines() if line.strip())


def _emulate(prog: str, n: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "virtualpar", "run", "--mpi", "--no-tag-output", "-n",
                           str(n),
                           os.path.join(HERE, prog), *args], capture_output=True, text=True, timeout=120)


def _mpiexec() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else shutil.which("mpiexec")


@pytest.mark.parametrize("prog",
                         ["p2p_and_collectives.py", "tutorial.py", "lifecycle.py", "contexts.py",
                          "buffers.py",
                                  "in_place.py", "semantics.py", "scans.py", "synchronous.py", "requests.py",
                                  "vectors.py", "probes.py"])
@pytest.mark.parametrize("n", [2, 4])
def test_the_program_set_prints_the_same_as_under_mpiexec(n, prog):
    emu = _emulate(prog, n)
    assert emu.returncode == 0, emu.stderr
    if _mpiexec() is None:  # the test extra installs mpich; without it, check against the expected values
        pytest.fail("mpiexec is not installed: pip install mpich")
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # one write per line: mpiexec then never splits a line
    real = run_mpiexec([_mpiexec(), "-n", str(n), sys.executable, os.path.join(HERE, prog)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert real.returncode == 0, real.stderr
    assert _lines(emu.stdout) == _lines(real.stdout)
    expect = {"p2p_and_collectives.py": f"total {n * (n + 1) // 2}", "tutorial.py": "gathered pi 3.14159",
              "lifecycle.py": f"rank {n - 1} self size 1 rank 0 sum {n}",
              "contexts.py": "rank 1 b got on b a got on a",
              "buffers.py": "rank 1 got [0.0, 1.0, 2.0] then [0.0, 1.0, 2.0, 0.0, "
                            "0.0, 0.0, 0.0, 0.0] count 3",
              "in_place.py": f"rank 0 Reduce_scatter_block [{n * (n - 1) / 2}, {n * (n - 1) / 2 + n}]",
              # MPICH's values
              "semantics.py": "rank 0 open line (-1, 1) from PROC_NULL -1 constants -2 -1 -1",
              "scans.py": f"rank {n - 1} scan {n * (n + 1) // 2} exscan {n * (n - 1) // 2}",
              "synchronous.py": "rank 0 issends done before their receives: (False, False)",
              "requests.py": "rank 0 waitsome [2] ['seven'] [(1, 7)]",
              "vectors.py": "rank 0 attrs 536870911 0 True",
              "probes.py": "rank 0 then [0, 1, 2, 3] 8 [0, 1] 7"}
    assert expect[prog] in emu.stdout


def test_a_deadlocked_program_is_named_not_hung():
    emu = _emulate("deadlock.py", 2)
    assert emu.returncode == 1
    # the script's own tags, not the device tags of its communicator's span (tag 1048576)
    assert "Deadlock" in emu.stderr and "device 0 waits recv from 1 (tag 0)" in emu.stderr
    # what the ranks printed before they blocked is shown, as mpiexec shows it (it was dropped)
    assert _lines(emu.stdout) == ["rank 0 waits for 1", "rank 1 waits for 0"]


def test_strict_mode_names_the_deadlock_of_a_program_that_relies_on_buffering_across_communicators():
    """contexts.py sends on communicator a, then on b; its receiver takes b's first.  MPI's eager
    sends let that through; above an eager limit of 0 it deadlocks.  The receive waits with ANY_TAG
    within b's tags, which the deadlock detector read as any tag at all, so it took device 0's send
    on a for the message device 1 was waiting for, and the run ended in a P2PTimeout after the op
    timeout instead of a named Deadlock."""
    emu = subprocess.run([sys.executable, "-m", "virtualpar", "run", "--mpi", "-n", "4", "--eager-limit", "0",
                          "--timeout", "60", os.path.join(HERE, "contexts.py")], capture_output=True,
                          text=True,
                         timeout=120)
    assert emu.returncode == 1
    assert ("Deadlock: deadlock (a cycle of waits): device 0 waits send to 1 (tag 0) "
            "← device 1 waits recv from 0 (tag any)" in emu.stderr)


def test_an_ssend_ring_is_named_as_the_deadlock_it_is_under_any_mpi():
    """Every rank ssends right, then receives: MPICH hangs there; the emulator names the cycle."""
    emu = _emulate("synchronous.py", 3, "--unsafe")
    assert emu.returncode == 1 and "never gets here" not in emu.stdout
    assert (
        "Deadlock" in emu.stderr
        and "device 0 waits send to 1 (tag 0) ← device 1 waits send to 2" in emu.stderr
    )


@pytest.mark.parametrize("prog, n, lines, error", [
    ("finished_then_raises.py", 4, [f"rank {r} done" for r in range(4)],
     "MPIAbort: rank 1 raised ValueError"),
    ("one_waits.py", 2, ["rank 0 started", "rank 1 started"], "Deadlock"),
])
def test_what_finished_ranks_printed_is_kept_when_another_fails(prog, n, lines, error):
    """A rank that had returned printed nothing: its output came back only with a run that then failed."""
    emu = _emulate(prog, n)
    assert emu.returncode == 1 and error in emu.stderr
    assert _lines(emu.stdout) == lines


def test_a_receive_with_mpi4pys_default_tag_deadlocks_by_name_not_timeout():
    emu = _emulate("recv_any_tag.py", 2)  # took the whole 60 s op timeout
    assert emu.returncode == 1
    assert "device 0 waits recv from 1 (tag any) ← device 1 waits recv from 0 (tag any)" in emu.stderr


def test_a_rank_that_raises_ends_the_job_with_its_traceback():
    """It printed its traceback into its own output, returned, and the job was reported as a
    Deadlock ("device 1 has returned from the run") without the traceback or the output."""
    emu = _emulate("raises.py", 3)
    assert emu.returncode == 1
    assert _lines(emu.stdout) == ["rank 0 started", "rank 1 started", "rank 2 started"]
    assert 'raises.py", line 7, in <module>' in emu.stderr and "ValueError: boom on 1" in emu.stderr
    assert "MPIAbort: rank 1 raised ValueError: boom on 1" in emu.stderr
    assert "Deadlock" not in emu.stderr and "runpy" not in emu.stderr  # the script's frames only


def test_stats_and_trace_apply_to_mpi_scripts_and_a_mesh_is_refused(tmp_path):
    trace = tmp_path / "t.json"
    prog = os.path.join(HERE, "lifecycle.py")
    done = subprocess.run([sys.executable, "-m", "virtualpar", "run", "--mpi", "-n", "2", "--stats",
                           "--trace", str(trace), prog], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "device-to-device" in done.stdout and trace.exists()  # both were silently ignored
    mesh = subprocess.run([sys.executable, "-m", "virtualpar", "run", "--mpi", "--mesh", "dp=2,tp=2", prog],
                          capture_output=True, text=True, timeout=120)
    assert mesh.returncode == 2 and "--mesh does not apply" in mesh.stderr


def test_abort_ends_the_job_with_its_error_code_and_the_output_so_far():
    emu = _emulate("aborts.py", 3)
    assert emu.returncode == 5, emu.stderr
    assert _lines(emu.stdout) == ["rank 0 started", "rank 1 started", "rank 2 started"]
    assert "rank 0 gives up" in emu.stderr and "MPIAbort: rank 0 called MPI_Abort(comm, 5)" in emu.stderr


def test_exit_codes_stderr_argv_and_calls_outside_the_subset():
    emu = _emulate("exits.py", 2, "a", "--b")
    assert emu.returncode == 3
    assert _lines(emu.stdout) == ["rank 0 argv ['a', '--b']", "rank 1 argv ['a', '--b']"]
    assert "rank 0 to stderr" in emu.stderr and "rank 1 to stderr" in emu.stderr
    bad = _emulate("exits.py", 2, "--unsupported")
    assert bad.returncode == 1
    assert "MPI.Comm.Ialltoallw is outside the subset virtualpar emulates" in bad.stderr
    assert "OutsideSubset" in bad.stderr  # a NotImplementedError and an AttributeError (hasattr is False)


def test_what_ranks_printed_is_kept_when_the_run_ends_with_unmatched_messages(tmp_path):
    prog = tmp_path / "unmatched.py"
    prog.write_text("from mpi4py import MPI\ncomm = MPI.COMM_WORLD\nprint(f'rank {comm.rank} "
                    "computed 42', flush=True)\n"
                    "if comm.rank == 0:\n    comm.send({'a': 1}, dest=1, tag=7)\n")
    emu = _emulate(str(prog), 2)  # an absolute path: os.path.join keeps it
    assert emu.returncode == 1 and "UnmatchedMessages" in emu.stderr
    assert _lines(emu.stdout) == ["rank 0 computed 42", "rank 1 computed 42"]


def test_abort_cannot_be_caught_by_the_script(tmp_path):
    """MPIAbort was an Exception: `except Exception` around Abort swallowed it and the job exited 0."""
    prog = tmp_path / "abort.py"
    prog.write_text("from mpi4py import MPI\ntry:\n    MPI.COMM_WORLD.Abort(3)\nexcept Exception:\n"
                    "    print('swallowed', flush=True)\n")
    emu = _emulate(str(prog), 2)
    assert emu.returncode == 3 and "swallowed" not in emu.stdout and "MPI_Abort(comm, 3)" in emu.stderr


def test_in_place_where_mpi_does_not_define_it_says_so(tmp_path):
    """It failed inside the facade: "'InPlace' object has no attribute 'reshape'"."""
    prog = tmp_path / "inplace.py"
    prog.write_text("from mpi4py import MPI\nimport numpy as np\ncomm = MPI.COMM_WORLD\n"
                    "comm.Gather(MPI.IN_PLACE, np.zeros(2), root=0)\n")  # IN_PLACE on rank 1, not the root
    emu = _emulate(str(prog), 2)
    assert emu.returncode == 1 and "Gather: MPI.IN_PLACE is the root's (rank 0) alone; rank 1" in emu.stderr
    prog.write_text("from mpi4py import MPI\nMPI.COMM_WORLD.Bcast(MPI.IN_PLACE)\n")
    emu = _emulate(str(prog), 2)
    assert emu.returncode == 1 and "MPI.IN_PLACE is not a buffer here" in emu.stderr


def test_a_buffer_that_does_not_split_into_equal_blocks_says_so(tmp_path):
    """Three entries over two ranks: mpi4py raises; the facade gave uneven blocks (Reduce_scatter_block
    in place: wrong sums) or a numpy broadcast error (Alltoall)."""
    prog = tmp_path / "blocks.py"
    for call in ("comm.Alltoall(MPI.IN_PLACE, np.zeros(3))",
                 "comm.Reduce_scatter_block(MPI.IN_PLACE, np.zeros(3))",
                 "comm.Allgather(MPI.IN_PLACE, np.zeros(3))"):
        prog.write_text(f"from mpi4py import MPI\nimport numpy as np\ncomm = MPI.COMM_WORLD\n{call}\n")
        emu = _emulate(str(prog), 2)
        assert emu.returncode == 1, call
        assert (
            "cannot infer count, number of entries 3 is not a multiple of required number of blocks 2"
            in emu.stderr
        ), call


@pytest.mark.parametrize("call, error", [
    ("comm.send(1, dest=-3)",
     "MPI rank -3 is not a rank of this communicator of size 4 (0..3 or PROC_NULL): MPI_ERR_RANK"),
    ("comm.Recv(np.zeros(1), source=4)",
     "MPI rank 4 is not a rank of this communicator of size 4 (0..3, ANY_SOURCE or PROC_NULL)"),
    ("comm.irecv(source=-5)", "MPI rank -5 is not a rank"),
    ("comm.bcast(1, root=-1)",
     "MPI root -1 is not a rank of this communicator of size 4 (0..3): MPI_ERR_ROOT"),
    ("comm.Reduce(np.ones(1), np.zeros(1), root=4)", "MPI root 4 is not a rank"),
    ("comm.send(1, dest=0, tag=2**29)",
     "MPI tag 536870912 is out of range 0..536870911 (Get_attr(MPI.TAG_UB)): "
                                        "MPI_ERR_TAG"),
    # (an overwrite of the next piece)
    ("comm.Alltoallv([np.ones(12), [3, 3, 3, 3]], [np.zeros(8), [2, 2, 2, 2]])",
     "Alltoallv: rank 0 sent 3 elements for a receive count of 2 (MPI_ERR_TRUNCATE)"),
])
def test_a_rank_or_root_out_of_range_is_an_error_not_another_rank(tmp_path, call, error):
    """A negative rank counted from the end of the communicator: dest=-3 went to rank 1, and
    root=-1 made every rank a sender to the last (MPI: MPI_ERR_RANK / MPI_ERR_ROOT); a tag past
    TAG_UB and a piece longer than its receive count are MPI's errors too."""
    prog = tmp_path / "ranks.py"
    prog.write_text(f"from mpi4py import MPI\nimport numpy as np\ncomm = MPI.COMM_WORLD\n{call}\n"
                    "print('rank', comm.rank, 'went on', flush=True)\n")
    emu = _emulate(str(prog), 4)
    assert emu.returncode == 1 and error in emu.stderr, emu.stderr
    assert "went on" not in emu.stdout
