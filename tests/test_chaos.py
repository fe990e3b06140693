"""Training through faults (issue 43): after a device is killed, hangs, or the driver is interrupted,
training restarts by itself on a new cluster from the last committed step and ends with the
fault-free weights bit for bit, leaving no process, /dev/shm entry or pymp-* directory behind.
The harness is ``benchmarks/bench_chaos.py``'s."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("bench_chaos",
                                               os.path.join(ROOT, "benchmarks", "bench_chaos.py"))
bench_chaos = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_chaos)


def test_the_faults_can_be_placed_at_every_send_and_receive_of_a_step():
    """1F1B on 2 ranks, 2 microbatches: each rank sends and receives once per microbatch each way."""
    assert bench_chaos.ops_per_rank(2, 2) == [4, 4]
    plan = bench_chaos.plan_faults(0, 200, 0.5, [4, 4])
    assert 60 < len(plan) < 140 and {k for k, _, _ in plan.values()} == set(bench_chaos.KINDS)
    assert all(1 <= at <= 4 and r in (0, 1) for _, r, at in plan.values())
    assert plan == bench_chaos.plan_faults(0, 200, 0.5, [4, 4])  # seeded


def test_a_kill_a_hang_and_an_interrupt_cost_only_the_steps_they_stopped(caplog):
    plan = {1: ("kill", 1, 2), 3: ("hang", 0, 1), 4: ("interrupt", 1, 3)}
    with caplog.at_level(logging.WARNING, logger="virtualpar.checkpoint"):
        r = bench_chaos.chaos(steps=6, stages=2, microbatches=2, timeout=1.0, plan=plan)
    assert r["unplanned"] == [], r["unplanned"]
    assert (r["injected"], r["fired"], r["survived"]) == (3, 3, 3)
    assert (r["attempts_lost"], r["rolled_back"], r["clusters"]) == (3, 0, 4)
    assert r["bit_equal"]
    assert r["left"] == {"processes": [], "shm": [], "pymp": []}
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "virtualpar.checkpoint"]
    assert [line.split(" from ")[1] for line in lines] == [f"step {s} (the cluster that held it "
                                                           "closed)" for s in (1, 3, 4)]


@pytest.mark.slow
def test_a_seeded_chaos_run_ends_with_the_fault_free_weights_and_leaves_nothing(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_chaos.py"), "--steps",
                           "40",
                           "--rate", "0.25", "--seed", "3", "--json"], capture_output=True, text=True,
                           timeout=600,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    assert r["bit_equal"] and r["unplanned"] == []
    assert r["injected"] >= 5 and r["survived"] == r["fired"] == r["injected"]
    assert r["left"] == {"processes": [], "shm": [], "pymp": []}
    assert [p.name for p in tmp_path.iterdir()] == []  # nothing in the run's temporary directory either
