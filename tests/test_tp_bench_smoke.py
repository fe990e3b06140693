"""Smoke test of benchmarks/bench_sharding_policies.py --quick --json: every policy ran and the
derived columns follow their definitions (no timing threshold: the machine is shared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_json_has_every_policy_and_consistent_columns():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_sharding_policies.py"),
                           "--quick", "--json"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    names = [(r["kind"], r["policy"]) for r in result["rows"]]
    assert names == [("matmul", p) for p in ("unsharded", "matched_inner", "row", "unmatched_inner", "outer",
                                             "full", "column")] \
        + [("ffn", p) for p in ("unsharded", "megatron", "sequence_parallel", "gspmd")]
    bw = result["memcpy_GBps"] * 1e9
    for r in result["rows"]:
        assert r["floor_s"] >= r["kernels_s"] > 0 and r["bytes_moved"] > 0
        assert r["ratio"] == r["wall_min_s"] / r["floor_s"] and r["wall_min_s"] <= r["wall_s"]
        assert r["vs_seed"] is None  # seed 003's times are for its own shapes, not --quick's
    assert result["targets"]["matched_inner_vs_seed>=10"] is None and bw > 0
