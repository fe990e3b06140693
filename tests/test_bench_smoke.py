"""The collectives benchmark runs and reports every figure it promises (no timing assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "bench_collectives.py")


def test_quick_benchmark_reports_json():
    out = subprocess.run([sys.executable, BENCH, "--quick", "--json", "--no-mpi"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["memcpy_Bps"] > 0 and r["latency_4KiB_s"] > 0 and r["startup8_s"] > 0
    assert [p["bytes"] for p in r["p2p"]] == [4096, 262144, 16777216]
    ops = {(c["op"], c["algorithm"], c["devices"]) for c in r["collectives"]}
    for n in (2, 4):
        assert {("all_reduce", "ring", n), ("all_reduce", "tree", n), ("all_reduce", "direct", n),
                ("all_gather", "ring", n), ("reduce_scatter", "ring", n)} <= ops
    for c in r["collectives"]:
        factor = 2 * (c["devices"] - 1) / c["devices"] if c["op"] == "all_reduce" else (c["devices"] - 1) / c["devices"]
        assert abs(c["busbw_Bps"] - c["algbw_Bps"] * factor) <= 1e-6 * c["algbw_Bps"]
        assert c["modelled_s"] > 0
    assert r["all_reduce_4KiB_check_on_s"] > 0 and r["all_reduce_4KiB_check_off_s"] > 0
    assert "8-device start-up <= 0.5 s" in r["targets"]
