"""Failure reports and summaries say what happened (issue: reports that are right)."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import VirtualCluster
from virtualpar.errors import DeviceError
from virtualpar.trace.event import Event
from virtualpar.trace.events import Trace
from virtualpar.trace.summary import summarize

from . import _deadlock_fns as fns

MIB = 1 << 20


def test_a_shared_memory_all_reduce_is_counted_in_the_summary():
    """64 MiB all_reduce on 2 devices through scratch: no messages, but 2 x 64 MiB moved (each device
    moves 2(p-1)/p of the array, as the ring would), and not counted twice for the ring."""
    n = 64 * MIB // 8
    with VirtualCluster(2, timeout=30.0) as c:
        assert c.run(fns.shm_all_reduce, n, "shm") == [2.0, 2.0]
        s = c.trace(clear=True).summary()
        assert (s.total_bytes, s.messages, s.shared_bytes) == (0, 0, 2 * 64 * MIB)
        head = " ".join(s.format(width=200).splitlines()[:1])
        assert all(len(line) <= 100 for line in s.format().splitlines())
        assert "128 MiB moved: 0 B sent in 0 messages, 128 MiB through shared memory by collectives" in head
        assert c.run(fns.shm_all_reduce, n // 8, "ring") == [2.0, 2.0]
        s = c.trace().summary()
        assert (s.total_bytes, s.messages, s.shared_bytes) == (2 * 8 * MIB, 4, 0)
        assert "through shared memory" not in s.format()


def test_idle_time_has_no_float_residue():
    """Device 1 ends 35.56 ps after device 0 on a 1 ms span: rounding, printed as 0 s, not "0.03556 ns"."""
    end = 1e-3
    events = [Event(rank=0, kind="compute", name="a", wall_start=0.0, wall_end=end, model_start=0.0,
                    model_end=end),
              Event(rank=1, kind="compute", name="b", wall_start=0.0, wall_end=end + 3.556e-11,
                    model_start=0.0, model_end=end + 3.556e-11)]
    s = summarize(Trace(events))
    assert s.idle == {0: 0.0, 1: 0.0}
    assert " ns" not in s.format()
    events.append(Event(rank=1, kind="compute", name="c", wall_start=2e-3, wall_end=3e-3, model_start=2e-3,
                        model_end=3e-3))
    s = summarize(Trace(events))
    assert s.idle[1] == pytest.approx(1e-3 - 3.556e-11)  # real idle time stays


def test_an_error_before_any_op_does_not_name_the_previous_runs_op():
    with VirtualCluster(2, timeout=30.0) as c:
        c.run(fns.one_send)
        with pytest.raises(DeviceError) as info:
            c.run(fns.fail_at_once)
        text = str(info.value)
        assert "raised ValueError in user code: bad input (before any op of this run)" in text
        assert "tag=4" not in text


def _numpy_error_in_user_code(dev):
    import numpy as np
    return np.array_split(np.ones(3), 0)  # numpy raises; the caller is the user's function


def test_an_error_is_blamed_on_the_code_whose_frame_raised_it(monkeypatch):
    """A numpy error raised inside a collective (the one-fence all_reduce of one int8 element, once)
    was reported as "raised OverflowError in user code" though the user's function only called
    all_reduce: the innermost frame outside numpy and the standard library decides."""
    import virtualpar.collectives.shm as shm
    from virtualpar.runtime.packaging import raised_in

    with pytest.raises(ZeroDivisionError) as info:
        shm.split_bounds(5, 0)
    assert raised_in(info.value).startswith("virtualpar code (virtualpar/collectives/shm.py:")

    split = shm.split_bounds
    # a bug inside the shm all_reduce (fork: inherited)
    monkeypatch.setattr(shm, "split_bounds", lambda m, n: split(m, 0))
    import numpy as np
    with VirtualCluster(2, timeout=30.0) as c:
        with pytest.raises(DeviceError,
                           match=r"raised ZeroDivisionError in virtualpar code "
                                 r"\(virtualpar/collectives/shm.py:\d+\)"):
            c.run(lambda dev: dev.all_reduce(np.ones(100000), algorithm="shm"))
        with pytest.raises(DeviceError, match="raised ValueError in user code: number sections"):
            c.run(_numpy_error_in_user_code)
        with pytest.raises(DeviceError, match="raised KeyError in user code"):
            c.run(lambda dev: exec("raise KeyError(3)"))  # code from a string is the user's


def test_a_failure_report_after_a_deadlock_says_why_its_timeline_is_empty():
    """It printed "(no events)": nothing of the failed run completed, which looked like a lost trace."""
    from virtualpar.errors import Deadlock
    from virtualpar.testing.report import failure_report

    with VirtualCluster(2, timeout=30.0) as c:
        with pytest.raises(Deadlock) as info:
            c.run(fns.recv_first)
        text = failure_report([c], info.value)
    assert "no op of the failed run completed, as in a deadlock" in text and "(no events)" not in text
    assert "op #1 recv from 1 tag=0 [failed" in text  # where each device was


def test_traffic_past_sixteen_devices_prints_a_line_per_device_and_the_heaviest_pairs():
    """A 64-device run printed a 64 x 64 matrix of ~700-character lines; past 16 devices it is a
    line per device with its totals, and the heaviest pairs, worked out here by hand."""
    from virtualpar.runtime.stats import TrafficStats
    n = 20
    b = np.zeros((n, n), np.int64)
    b[3, 7], b[3, 8], b[5, 3] = 900, 100, 50
    m = (b > 0).astype(np.int64) * 2
    stats = TrafficStats(b, m, np.zeros(n, np.int64), np.zeros(n, np.int64), 0)
    lines = stats.format().splitlines()
    assert lines[0] == "20 devices, one line each (the src x dst matrix is TrafficStats.bytes)"
    assert lines[1].split() == ["device", "sent", "received", "messages", "peers"]
    rows = lines[3:3 + n]  # under the head and its rule
    assert rows[3].split() == ["3", "1000", "B", "50", "B", "4",
                               "2"] and rows[7].split() == ["7", "0", "B", "900", "B", "0", "0"]
    assert lines[-2] == "heaviest pairs: 3->7 900 B, 3->8 100 B, 5->3 50 B"
    assert lines[-1] == "device-to-device 1.025 KiB (1,050 B); host->device 0 B; device->host 0 B"
    assert len(lines) == 3 + n + 2 and max(map(len, lines)) <= 100
    small = stats.format(matrix_up_to=n).splitlines()  # the matrix, as up to 16 devices by default
    assert small[0].startswith("src\\dst") and small[1 + 3].split()[1 + 7:1 + 7 + 2] == ["900", "B"]
    assert max(map(len, small)) <= 100 and small[1 + 3].split()[1] == "-"


def test_the_traffic_matrix_folds_its_destinations_into_the_width():
    """16 devices printed a 180-column matrix of bare byte counts; now binary units, folded into
    blocks of destinations that fit the width, every cell kept."""
    from virtualpar.runtime.stats import TrafficStats
    n = 16
    b = np.arange(n * n, dtype=np.int64).reshape(n, n) * 1000
    stats = TrafficStats(b, b > 0, np.zeros(n, np.int64), np.zeros(n, np.int64), 0)
    for width in (60, 100):
        text = stats.format(width=width)
        assert max(map(len, text.splitlines())) <= width
        blocks = text.split("\n\n")
        seen = {}
        for block in blocks:
            head, *rows = block.splitlines()
            dsts = [int(d) for d in head.split()[1:]]
            step = (len(head) - 7) // len(dsts)  # right-aligned cells at fixed positions
            for row in rows[:n]:  # (the last block is followed by the totals)
                for k, d in enumerate(dsts):
                    seen[int(row[:7]), d] = row[7 + k * step:7 + (k + 1) * step].strip()
        from virtualpar.trace.fmt import nbytes
        assert seen == {(s, d): nbytes(int(b[s, d])) if b[s, d] else "-" for s in range(n) for d in range(n)}


def test_counted_nouns_agree_with_their_number():
    from virtualpar._words import counted, plural

    assert [counted(n, "op") for n in (0, 1, 2)] == ["0 ops", "1 op", "2 ops"]
    assert counted(1, "model chunk") == "1 model chunk" and counted(3, "model chunk") == "3 model chunks"
    assert plural(1, "was", "were") == "was" and plural(2, "was", "were") == "were"
