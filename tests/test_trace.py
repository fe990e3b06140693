"""Tests of the event log and its views, against small hand-worked traces (no processes)."""

from __future__ import annotations

import builtins
import importlib
import json
import pickle
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from virtualpar import VirtualCluster
from virtualpar.errors import VirtualParError
from virtualpar.trace import Event, Summary, Trace, critical_path, format_bytes, format_seconds, summarize

MS = 1e-3


def wall_of(model: float) -> float:
    """The hand examples' wall clock: a linear map of the model clock (so nesting is kept)."""
    return 0.1 + 2.0 * model


def ev(rank: int, kind: str, name: str, start_ms: float, end_ms: float, **kw) -> Event:
    s, e = start_ms * MS, end_ms * MS
    return Event(rank, kind, name, wall_of(s), wall_of(e), s, e, **kw)


def example_late_send() -> Trace:
    """Device 1 posts its recv at 1 ms but device 0 sends only at 2..3 ms: the path crosses."""
    return Trace([
        ev(0, "compute", "matmul", 0, 2),
        ev(0, "send", "send", 2, 3, nbytes=1024, peer=1, seq=1, flow="0>1#0", shape=(16, 16),
           dtype="float32"),
        ev(1, "recv", "recv", 1, 3, nbytes=1024, peer=0, seq=0, flow="0>1#0"),
        ev(1, "compute", "add", 3, 4),
    ])


def example_early_send() -> Trace:
    """The send is long done when device 1 gets to its recv: the path stays on device 1."""
    return Trace([
        ev(0, "compute", "a", 0, 1),
        ev(0, "send", "send", 1, 2, nbytes=64, peer=1, flow="0>1#0"),
        ev(1, "compute", "b", 0, 3),
        ev(1, "recv", "recv", 3, 3.5, nbytes=64, peer=0, flow="0>1#0"),
        ev(1, "compute", "c", 3.5, 5),
    ])


def example_collective() -> Trace:
    """A 2-device all_reduce whose send/recv lie inside it; compute overlaps it on device 0."""
    g = (0, 1)
    return Trace([
        ev(0, "compute", "A0", 0, 1.5),
        ev(0, "collective", "all_reduce", 1, 4, group=g, nbytes=200, seq=3),
        ev(0, "send", "send", 1, 2, nbytes=100, peer=1, flow="0>1#0", group=g),
        ev(0, "recv", "recv", 2, 4, nbytes=100, peer=1, flow="1>0#0", group=g),
        ev(0, "compute", "D0", 4, 5),
        ev(1, "compute", "A1", 0, 2.5),
        ev(1, "collective", "all_reduce", 2.5, 4.5, group=g, nbytes=200, seq=3),
        ev(1, "send", "send", 2.5, 3.5, nbytes=100, peer=0, flow="1>0#0", group=g),
        ev(1, "recv", "recv", 3, 4.5, nbytes=100, peer=0, flow="0>1#0", group=g),
    ], device_names={0: "device 0 (dp=0, tp=0)", 1: "device 1 (dp=0, tp=1)"})


# -- Event and Trace ---------------------------------------------------------------------------------

def test_event_clocks_and_errors():
    e = ev(0, "compute", "matmul", 1, 3)
    assert e.start("model") == pytest.approx(1 * MS) and e.end("model") == pytest.approx(3 * MS)
    assert e.duration("model") == pytest.approx(2 * MS)
    assert e.duration("wall") == pytest.approx(4 * MS)
    assert e.start() == e.model_start
    for call in (e.start, e.end, e.duration):
        with pytest.raises(ValueError, match=r"unknown clock 'cpu'.*'model', 'wall'"):
            call("cpu")
    with pytest.raises(ValueError, match="unknown kind 'comput'"):
        Event(0, "comput", "x", 0, 1, 0, 1)


def test_a_trace_pickles_with_its_device_names():
    """Its names were a MappingProxyType: 'cannot pickle mappingproxy' (multiprocessing, caching)."""
    t = Trace([Event(rank=1, kind="compute", name="c", wall_start=0.0, wall_end=1.0, model_start=0.0,
                     model_end=1.0)],
              device_names={1: "device 1 (dp=0, tp=1)"})
    back = pickle.loads(pickle.dumps(t))
    assert back.events == t.events and back.device_names == {1: "device 1 (dp=0, "
                                                                "tp=1)"} and back.ranks == (1,)


def test_event_pickles_hashes_and_round_trips_dict():
    e = ev(2, "send", "send", 0, 1, nbytes=8, peer=5, seq=17, group=(2, 5), shape=(2, 3), dtype="float32",
           flow="2>5#17", args=(("tag", 4), ("note", (1, 2))))
    assert pickle.loads(pickle.dumps(e)) == e
    assert hash(e) == hash(pickle.loads(pickle.dumps(e)))
    assert e.arg("tag") == 4 and e.arg("missing", "d") == "d"
    assert Event.from_dict(json.loads(json.dumps(e.to_dict()))) == e
    with pytest.raises(AttributeError):
        e.rank = 3  # frozen


def test_trace_sorting_filter_names_and_span():
    t = example_collective()
    shuffled = list(t.events)
    random.Random(0).shuffle(shuffled)
    assert Trace(shuffled, t.device_names) == t
    assert [e.rank for e in t.events] == sorted(e.rank for e in t.events)
    # at equal start the enclosing collective comes before its nested send
    r1 = t.by_rank()[1]
    assert [e.kind for e in r1] == ["compute", "collective", "send", "recv"]
    assert t.ranks == (0, 1)
    assert t.device_name(1) == "device 1 (dp=0, tp=1)"
    assert Trace([ev(0, "compute", "x", 0, 1)]).device_names == {0: "device 0"}
    assert len(t.filter(kind="send")) == 2
    assert {e.kind for e in t.filter(kind=("send", "recv"), rank=0)} == {"send", "recv"}
    assert t.filter(rank=0).device_names == t.device_names
    with pytest.raises(ValueError, match=r"unknown kind \['sends'\]"):
        t.filter(kind="sends")
    with pytest.raises(ValueError, match=r"unknown kinds \['a', 'b'\]"):
        t.filter(kind=("b", "a", "send"))
    assert t.span("model") == pytest.approx(5 * MS)
    assert t.span("wall") == pytest.approx(10 * MS)
    assert t.bounds("wall") == pytest.approx((0.1, 0.1 + 10 * MS))
    with pytest.raises(VirtualParError):
        t.span("modelled")
    silent = Trace([ev(0, "compute", "x", 0, 1)], device_names={0: "d0", 1: "d1"})
    assert silent.ranks == (0, 1) and silent.by_rank()[1] == ()
    assert Trace().span() == 0.0 and Trace().ranks == ()


def test_trace_json_round_trip(tmp_path):
    t = example_collective()
    path = t.save_json(tmp_path / "trace.json")
    assert Trace.load_json(path) == t
    (tmp_path / "other.json").write_text('{"traceEvents": []}')
    with pytest.raises(ValueError, match="not a virtualpar trace"):
        Trace.load_json(tmp_path / "other.json")


# -- Chrome JSON -------------------------------------------------------------------------------------

def _x_events(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def test_chrome_structure_names_and_tracks():
    t = example_collective()
    doc = json.loads(json.dumps(t.to_chrome()))
    assert doc["displayTimeUnit"] == "ms" and doc["otherData"]["clock"] == "model"
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs == {0: "device 0 (dp=0, tp=0)", 1: "device 1 (dp=0, tp=1)"}
    assert {e["pid"]: e["args"]["sort_index"] for e in meta if e["name"] == "process_sort_index"} == {
        0: 0,
        1: 1,
    }
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    # device 1's recv overlaps its send without nesting in it: it moves to a second comm lane
    assert threads == {(0, 0): "compute", (0, 1): "comm", (1, 0): "compute", (1, 1): "comm", (1, 3): "comm 2"}
    xs = _x_events(doc)
    assert len(xs) == len(t)
    for x in xs:
        assert {"pid", "tid", "ts", "dur", "name", "cat", "args"} <= set(x) and x["dur"] >= 0
        assert x["tid"] == (
            0 if x["args"]["kind"] == "compute" else (3 if (x["pid"], x["name"]) == (1, "recv") else 1)
        )
    # the nested send/recv of device 0 lie inside its collective on the same track
    coll = next(x for x in xs if x["pid"] == 0 and x["cat"] == "collective")
    assert coll["ts"] == pytest.approx(1000) and coll["dur"] == pytest.approx(3000)
    assert coll["args"]["group"] == [0, 1] and coll["args"]["seq"] == 3 and coll["args"]["bytes"] == 200
    for x in xs:
        if x["pid"] == 0 and x["cat"] == "p2p":
            assert x["tid"] == coll["tid"]
            assert coll["ts"] <= x["ts"] and x["ts"] + x["dur"] <= coll["ts"] + coll["dur"] + 1e-9
    send = next(x for x in xs if x["pid"] == 0 and x["name"] == "send")
    assert send["args"]["peer"] == 1 and send["args"]["bytes"] == 100 and send["args"]["flow"] == "0>1#0"
    assert send["args"]["wall_dur_us"] == pytest.approx(2000)  # the other clock, 2x the model here


def test_chrome_flows_pair_each_send_with_its_recv():
    t = example_collective()
    doc = t.to_chrome()
    xs = _x_events(doc)
    starts = [e for e in doc["traceEvents"] if e["ph"] == "s"]
    ends = [e for e in doc["traceEvents"] if e["ph"] == "f"]
    assert len(starts) == len(ends) == 2
    for s in starts:
        f = next(f for f in ends if f["id"] == s["id"])
        assert f["bp"] == "e" and f["cat"] == s["cat"] and f["name"] == s["name"]
        assert f["ts"] >= s["ts"]
        src = next(x for x in xs if x["args"].get("flow") == s["name"] and x["name"] == "send")
        dst = next(x for x in xs if x["args"].get("flow") == s["name"] and x["name"] == "recv")
        assert (s["pid"], s["tid"], s["ts"], s["cat"]) == (src["pid"], src["tid"], src["ts"], src["cat"])
        assert (f["pid"], f["tid"]) == (dst["pid"], dst["tid"])
        assert dst["ts"] <= f["ts"] <= dst["ts"] + dst["dur"]
    by_name = {s["name"]: s for s in starts}
    f10 = next(f for f in ends if f["id"] == by_name["1>0#0"]["id"])
    assert f10["ts"] == pytest.approx(2500)  # recv posted at 2 ms, send started at 2.5 ms


def test_chrome_unmatched_message_gets_no_arrow():
    t = Trace([ev(0, "send", "send", 0, 1, peer=1, flow="0>1#0"),
               ev(1, "recv", "recv", 0, 1, peer=0, flow="0>1#9"),
               ev(1, "recv", "recv", 2, 3, peer=0)])
    doc = t.to_chrome()
    assert not [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    one = Trace(list(example_late_send().events))
    assert len([e for e in one.to_chrome()["traceEvents"] if e["ph"] in ("s", "f")]) == 2


def test_chrome_clock_choice_moves_timestamps():
    t = example_late_send()
    model, wall = t.to_chrome("model"), t.to_chrome(clock="wall")
    assert wall["otherData"]["clock"] == "wall"
    for xm, xw in zip(_x_events(model), _x_events(wall)):
        assert xm["name"] == xw["name"]
        assert xw["ts"] == pytest.approx(wall_of(xm["ts"] / 1e6) * 1e6)
        assert xw["dur"] == pytest.approx(2 * xm["dur"])
    with pytest.raises(ValueError, match="unknown clock"):
        t.to_chrome("both")


def test_chrome_is_deterministic_and_plain_json(tmp_path):
    t = example_collective()
    shuffled = list(t.events)
    random.Random(1).shuffle(shuffled)
    assert json.dumps(Trace(shuffled, t.device_names).to_chrome()) == json.dumps(t.to_chrome())
    odd = Trace([Event(0, "compute", "mm", 0.0, 1e-7, 0.0, 1e-7, nbytes=np.int64(8), shape=(np.int64(2), 3),
                       args=(("flops", np.float32(2.0)), ("dims", np.arange(2))))])
    doc = odd.to_chrome()
    text = json.dumps(doc)  # raises on numpy types
    assert '"flops": 2.0' in text and '"dims": [0, 1]' in text
    assert doc["displayTimeUnit"] == "ns"
    path = t.write_chrome(tmp_path / "t.json", clock="wall")
    assert json.loads(open(path).read()) == json.loads(json.dumps(t.to_chrome("wall")))


# -- text timeline -----------------------------------------------------------------------------------

def test_text_timeline_hand_example():
    """width 51 with 8-character labels leaves 40 columns of 100 µs for the 4 ms span."""
    out = example_late_send().to_text(width=51)
    lines = out.splitlines()
    assert lines[0:2] == ["timeline (model clock): 2 devices, 0 s .. 4 ms, 1", "column = 100 µs"]
    assert lines[2] == "device 0 |" + "#" * 20 + ">" * 10 + "." * 10 + "|"
    assert lines[3] == "device 1 |" + "." * 10 + "<" * 20 + "#" * 10 + "|"
    # ticks every 1 ms (10 columns: the smallest 1-2-5 step whose labels fit), the last label
    # pulled left so that it ends with the grid
    assert lines[4] == " " * 9 + "+---------+---------+---------+---------+"
    assert lines[5] == " " * 9 + "0 s       1 ms      2 ms      3 ms   4 ms"
    assert lines[6].startswith("legend") and "# compute" in lines[6] and ". idle" in lines[7]
    assert len(lines) == 8  # nothing is shorter than a column: no list
    assert all(len(line) <= 51 for line in lines)
    wall = example_late_send().to_text(clock="wall", width=51).splitlines()
    assert wall[0] == "timeline (wall clock): 2 devices, 100 ms .. 108 ms,"
    assert wall[2:4] == lines[2:4]  # a linear clock map leaves the picture alone
    assert wall[5] == " " * 9 + "100 ms    102 ms    104 ms    106 ms"  # no room left for "108 ms"


def test_text_time_axis_steps():
    from virtualpar.trace.text import time_axis

    # 0..1 s over 50 columns (20 ms each): labels are up to 6 wide + 2, so steps of 200 ms (10 columns)
    marks, labels = time_axis(0.0, 1.0, 50)
    assert marks == ("+" + "-" * 9) * 5 + "+"
    assert labels == "0 s       200 ms    400 ms    600 ms    800 ms  1 s"
    # an axis that does not start at a round time: the first tick is the first multiple of the step
    marks, labels = time_axis(0.5e-6, 10.5e-6, 20)  # 0.5 µs a column; step 5 µs = 10 columns
    assert marks == "-" * 9 + "+" + "-" * 9 + "+" + "-"
    assert labels == " " * 9 + "5 µs" + " " * 3 + "10 µs"  # the last label ends with the grid


def test_text_lists_the_actions_too_short_to_show():
    """A 1 µs send and a zero-length barrier wait in a 4 ms trace are under one column: listed
    below the grid in time order; the collective's own steps are not."""
    g = (0, 1)
    t = Trace([ev(0, "compute", "matmul", 0, 4),
               ev(1, "send", "ping", 2, 2.001, peer=0, nbytes=8),
               ev(1, "wait", "barrier", 1, 1),
               ev(1, "collective", "all_reduce", 3, 3.5, group=g),
               ev(1, "send", "send", 3, 3.01, peer=0, group=g)])
    lines = t.to_text(width=51).splitlines()
    at = lines.index("too short to show (under 1 column = 100 µs), in")
    assert lines[at + 1] == "time order:"
    wide = t.to_text(width=100).splitlines()
    assert lines[at + 2:] == [line[:50] + "…" for line in wide[-2:]]
    assert wide[-2:] == ["  device 1  " + "wait barrier".ljust(28) + " at " + "1 ms".ljust(10) + " for 0 s",
                         "  device 1  " + "send ping to "
                                          "0".ljust(28) + " at " + "2 ms".ljust(10) + " for 1 µs"]
    assert wide[1] == "device 0 |" + "#" * 89 + "|"  # 100 - 8 - 3 columns
    many = Trace([ev(0, "compute", "c", 0, 100)] + [ev(1, "send", f"s{k}", k, k, peer=0) for k in range(20)])
    text = many.to_text(width=80).splitlines()
    assert text[-1] == "  ... and 8 more" and text[-2].startswith("  device 1  send s11 to 0")


def test_text_lines_fit_every_width():
    t = example_collective()
    for width in (20, 33, 60, 100, 140):
        lines = t.to_text(width=width).splitlines()
        assert all(len(line) <= width for line in lines), (width, lines)
        rows = [line for line in lines if line.endswith("|")]
        assert len(rows) == 2 and all(len(r) == width for r in rows)  # the grid takes the rest of the line


def test_text_priorities_names_and_width():
    t = example_collective()
    rows = [line for line in t.to_text(width=34).splitlines() if line.endswith("|")]  # 10 columns of 0.5 ms
    # compute beats the collective it overlaps; the collective hides its nested send/recv
    assert rows == ["device 0 (dp=0, tp=0) |###=====##|", "device 1 (dp=0, tp=1) |#####====.|"]
    # names too long for a 10-column grid in 20: the ranks name the rows
    assert [line for line in t.to_text(width=20).splitlines() if line.endswith("|")] == [
        "0 |#####=======####|", "1 |########=======.|"]
    both = Trace([ev(0, "send", "send", 0, 2, peer=1), ev(0, "recv", "recv", 1, 3, peer=1),
                  ev(1, "wait", "barrier", 0, 3)])
    assert [line for line in both.to_text(width=14).splitlines() if line.endswith("|")] == [
        "0 |>>>xxxx<<<|", "1 |~~~~~~~~~~|"]  # 0.3 ms a column
    with pytest.raises(ValueError, match="width must be a positive int"):
        t.to_text(width=0)
    with pytest.raises(ValueError, match="unknown clock"):
        t.to_text(clock="cpu")


def test_text_zero_length_event_and_empty_trace():
    t = Trace([ev(0, "compute", "x", 0, 4), ev(1, "send", "ping", 2, 2, peer=0)])
    lines = t.to_text(width=21).splitlines()
    assert [line for line in lines if line.endswith("|")][1] == "device 1 |.....>....|"
    assert lines[-1] == "  device 1  send pin…"  # listed below, cut to the width
    assert Trace().to_text() == "(no events)"
    assert [line for line in Trace([ev(0, "send", "s", 1, 1)]).to_text(width=16).splitlines()
            if line.endswith("|")] == ["0 |>...........|"]  # a 5-column grid is too narrow: ranks as names


def test_format_units():
    assert format_seconds(0) == "0 s"
    assert format_seconds(12.5e-3) == "12.5 ms"
    assert format_seconds(3e-6) == "3 µs"
    assert format_seconds(2.5) == "2.5 s"
    assert format_seconds(4e-9) == "4 ns"
    assert (
        format_bytes(512) == "512 B" and format_bytes(1536) == "1.5 KiB" and format_bytes(3 << 20) == "3 MiB"
    )


# -- summary and critical path -----------------------------------------------------------------------

def test_summary_late_send():
    s = example_late_send().summary()
    assert isinstance(s, Summary) and s.clock == "model"
    assert s.span == pytest.approx(4 * MS)
    assert s.busy == pytest.approx({0: 2 * MS, 1: 1 * MS})
    assert s.comm == pytest.approx({0: 1 * MS, 1: 2 * MS})
    assert s.idle == pytest.approx({0: 1 * MS, 1: 1 * MS})
    assert s.link_bytes == {(0, 1): 1024} and s.link_messages == {(0, 1): 1} and s.total_bytes == 1024
    assert [(e.rank, e.name) for e in s.critical_path] == [(0, "matmul"), (0, "send"), (1, "recv"),
                                                           (1, "add")]
    # 2 (matmul) + 1 (send) + 0 (recv ends with the send) + 1 (add)
    assert s.critical_path_length == pytest.approx(4 * MS)
    with pytest.raises(AttributeError):
        s.span = 0.0  # frozen


def test_critical_path_stays_on_device_when_send_was_early():
    path, length = critical_path(example_early_send())
    assert [(e.rank, e.name) for e in path] == [(1, "b"), (1, "recv"), (1, "c")]
    assert length == pytest.approx(5 * MS)


def test_summary_collective_with_overlap():
    t = example_collective()
    s = summarize(t)
    assert s.span == pytest.approx(5 * MS)
    # device 0: compute [0,1.5] u [4,5]; comm [1,4] of which [1,1.5] hides behind compute
    assert s.busy == pytest.approx({0: 2.5 * MS, 1: 2.5 * MS})
    assert s.comm == pytest.approx({0: 2.5 * MS, 1: 2.0 * MS})
    assert s.idle == pytest.approx({0: 0.0, 1: 0.5 * MS}, abs=1e-12)
    assert s.link_bytes == {(0, 1): 100, (1, 0): 100} and s.total_bytes == 200 and s.messages == 2
    # D0 waits for its recv, which waited on device 1's send, which followed A1
    assert [(e.rank, e.name) for e in s.critical_path] == [(1, "A1"), (1, "send"), (0, "recv"), (0, "D0")]
    assert s.critical_path_length == pytest.approx(5 * MS)  # 2.5 + 1 + (4 - 3.5) + 1
    wall = summarize(t, clock="wall")
    assert wall.critical_path == s.critical_path
    assert wall.critical_path_length == pytest.approx(2 * s.critical_path_length)
    assert wall.comm == pytest.approx({r: 2 * v for r, v in s.comm.items()})
    text = s.format()
    assert (
        "device 1 (dp=0, tp=1)" in text
        and "0 -> 1" in text
        and "critical path: 5 ms of 5 ms in 4 events" in text
    )
    assert str(s) == text
    with pytest.raises(ValueError, match="unknown clock"):
        summarize(t, clock="cycles")


def test_summary_of_empty_trace():
    s = summarize(Trace())
    assert s.span == 0 and s.critical_path == () and s.total_bytes == 0
    assert s.format().startswith("summary (model clock): 0 devices")


# -- PNG Gantt chart ---------------------------------------------------------------------------------

def test_png_written_when_matplotlib_is_installed(tmp_path):
    pytest.importorskip("matplotlib")
    path = example_collective().to_png(tmp_path / "gantt.png", title="all_reduce")
    with open(path, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    Trace().to_png(tmp_path / "empty.png", clock="wall")


def test_png_without_matplotlib_says_how_to_install(monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    import virtualpar.trace.gantt as gantt
    importlib.reload(gantt)  # the module itself imports without matplotlib
    with pytest.raises(ImportError, match=r'pip install "virtualpar\[viz\]"'):
        gantt.to_png(example_late_send(), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# -- properties of the definitions on random traces --------------------------------------------------

@st.composite
def random_traces(draw):
    n_ranks = draw(st.integers(1, 3))
    events, flow_no = [], 0
    for rank in range(n_ranks):
        t = 0.0
        for _ in range(draw(st.integers(0, 5))):
            gap = draw(st.sampled_from([0.0, 0.5, 1.0]))
            dur = draw(st.sampled_from([0.0, 1.0, 2.0]))
            kind = draw(st.sampled_from(["compute", "send", "recv", "collective", "wait"]))
            events.append(ev(rank, kind, kind, t + gap, t + gap + dur))
            t += gap + dur
    sends = [i for i, e in enumerate(events) if e.kind == "send"]
    recvs = [i for i, e in enumerate(events) if e.kind == "recv"]
    for i, j in zip(sends, recvs):  # pair some sends and recvs by flow, whatever their timing
        flow_no += 1
        for k in (i, j):
            e = events[k]
            events[k] = Event(e.rank, e.kind, e.name, e.wall_start, e.wall_end, e.model_start, e.model_end,
                              nbytes=8, peer=events[j if k == i else i].rank, flow=f"f{flow_no}")
    return Trace(events)


@settings(max_examples=60, deadline=None)
@given(random_traces())
def test_summary_and_path_invariants(trace):
    s = summarize(trace)
    for r in trace.ranks:
        assert s.busy[r] + s.comm[r] + s.idle[r] == pytest.approx(s.span, abs=1e-12)
        assert min(s.busy[r], s.comm[r], s.idle[r]) >= -1e-15
    path = s.critical_path
    if trace.events:
        last = max(e.model_end for e in trace.events)
        assert path[-1].model_end == last
        assert s.critical_path_length <= s.span + 1e-12
    for prev, nxt in zip(path, path[1:]):
        crosses = prev.kind == "send" and nxt.kind == "recv" and prev.flow == nxt.flow is not None
        assert crosses or (prev.rank == nxt.rank and prev.model_end <= nxt.model_start + 1e-15)
    json.dumps(trace.to_chrome())
    text = trace.to_text(width=40).splitlines()
    assert all(len(line) <= 40 for line in text)
    assert sum(1 for line in text if line.endswith("|")) == (len(trace.ranks) if len(trace) else 0)


def _tree_broadcast(dev):
    dev.broadcast(np.ones(1 << 20) if dev.rank == 0 else None, algorithm="tree")
    dev.isend(np.ones(1 << 20), (dev.rank + 1) % dev.size).wait() if dev.rank % 2 == 0 else \
        dev.recv((dev.rank - 1) % dev.size)


def test_on_the_wall_clock_no_message_is_received_before_it_was_sent():
    """isend and the collectives' sends took their start time after posting, which for 8 MiB takes
    milliseconds: a receive could end before its send 'started', and Chrome flow arrows went back
    in time (17 runs of 20 had one)."""
    with VirtualCluster(4, hardware="h100-node") as c:
        for _ in range(5):
            c.run(_tree_broadcast)
            events = c.trace(clear=True).events
            sends = {e.flow: e for e in events if e.kind == "send"}
            pairs = [(sends[e.flow], e) for e in events if e.kind == "recv" and e.flow in sends]
            assert pairs and all(r.wall_end >= s.wall_start for s, r in pairs)
