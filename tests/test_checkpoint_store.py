"""The checkpoint format without processes: round trip, pieces along an axis, atomic replacement,
and every damaged or foreign input refused with a named error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from virtualpar.checkpoint import (INDEX, Checkpoint, CheckpointError, Piece, TileError, assemble, cut,
                                   piece_along, write_checkpoint)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _shards():
    rng = np.random.default_rng(0)
    return {"stage0": {"model/0.weight": rng.standard_normal((3, 4)), "optim/0.weight/step": np.array(7)},
            "stage1": {"model/2.bias": rng.standard_normal(5).astype(np.float32),
                       "model/2.ids": np.arange(6, dtype=np.int64).reshape(2, 3)}}


def test_round_trip_keeps_every_array_bit_for_bit_and_the_index_says_what_is_where(tmp_path):
    shards = _shards()
    write_checkpoint(tmp_path / "c", shards, step=5, layout={"kind": "test", "stages": 2}, meta={"x": 1})
    ck = Checkpoint(tmp_path / "c")
    assert (ck.step, ck.layout, ck.meta) == (5, {"kind": "test", "stages": 2}, {"x": 1})
    for arrays in shards.values():
        for key, want in arrays.items():
            got = ck.tensor(key)
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), key
    index = json.loads((tmp_path / "c" / INDEX).read_text())
    assert index["format"] == "virtualpar-checkpoint" and index["version"] == 1
    entry = index["tensors"]["model/2.ids"]
    assert entry["shape"] == [2, 3] and np.dtype(entry["dtype"]) == np.int64
    (piece,) = entry["pieces"]
    assert piece["file"].startswith("stage1.5-") and piece["box"] == [[0, 2], [0, 3]]
    for name, info in index["files"].items():
        assert os.path.getsize(tmp_path / "c" / name) == info["bytes"]
    assert sorted(info["arrays"] for info in index["files"].values()) == [2, 2]


def test_a_tensor_split_along_an_axis_over_files_assembles_and_recuts():
    """Tensor-parallel style: columns split over two shards; re-cut into four for another layout."""
    full = np.arange(24.0).reshape(3, 8)
    a, b = piece_along(full[:, :4], 1, 0, 8), piece_along(full[:, 4:], 1, 4, 8)
    assert a.box() == [[0, 3], [0, 4]] and b.box() == [[0, 3], [4, 8]] and b.full_shape == (3, 8)
    got = assemble("w", (3, 8), np.float64, [(b.box(), b.array), (a.box(), a.array)])
    assert np.array_equal(got, full)
    parts = [got[i] for i in cut(got.shape, 1, 4)]
    for p, q in zip(parts, np.split(full, 4, axis=1)):
        assert np.array_equal(p, q)
    with pytest.raises(TileError, match="8 is not divisible by 3"):
        cut((3, 8), 1, 3)


def test_split_tensor_through_files(tmp_path):
    full = np.arange(12.0).reshape(4, 3)
    write_checkpoint(tmp_path / "c", {"tp0": {"w": piece_along(full[:2], 0, 0, 4)},
                                      "tp1": {"w": piece_along(full[2:], 0, 2, 4)}}, step=1, layout={})
    assert np.array_equal(Checkpoint(tmp_path / "c").tensor("w"), full)


@pytest.mark.parametrize("boxes, match", [
    ([[[0, 2], [0, 3]]], "leave a hole"),
    ([[[0, 2], [0, 3]], [[1, 3], [0, 3]], [[2, 4], [0, 3]]], "overlaps"),
    ([[[0, 2], [0, 3]], [[2, 5], [0, 3]]], "lies outside"),
])
def test_pieces_that_do_not_make_up_the_tensor_are_refused(boxes, match):
    pieces = [(box, np.zeros((box[0][1] - box[0][0], 3))) for box in boxes]
    with pytest.raises(TileError, match=match):
        assemble("w", (4, 3), np.float64, pieces)


def test_a_piece_of_another_dtype_or_shape_is_refused():
    with pytest.raises(TileError, match="is float32, the tensor float64"):
        assemble("w", (2,), np.float64, [([[0, 2]], np.zeros(2, np.float32))])
    with pytest.raises(TileError, match=r"holds an array of shape \(3,\), its box \(2,\)"):
        assemble("w", (2,), np.float64, [([[0, 2]], np.zeros(3))])


def _one_shard(path):
    write_checkpoint(path, {"stage1": {"a": np.arange(3.0), "b": np.ones(2), "c": np.zeros(4)}}, step=2,
                     layout={})
    (name,) = json.loads((path / INDEX).read_text())["files"]
    return name


def _fix_index(path, name):
    """Make the index agree with a tampered file's size and hash, so the reader gets to its contents."""
    import hashlib

    index = json.loads((path / INDEX).read_text())
    data = (path / name).read_bytes()
    index["files"][name].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (path / INDEX).write_text(json.dumps(index))


def test_a_truncated_shard_is_refused_with_its_name_and_sizes(tmp_path):
    name = _one_shard(tmp_path)
    size = os.path.getsize(tmp_path / name)
    with open(tmp_path / name, "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(CheckpointError,
                       match=rf"shard file {name} is truncated \(expected {size} bytes, found "
                                              rf"{size - 10}\)"):
        Checkpoint(tmp_path).tensor("a")


def test_a_corrupted_shard_is_refused_by_its_hash(tmp_path):
    name = _one_shard(tmp_path)
    data = bytearray((tmp_path / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / name).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"shard file {name} is corrupted: its sha256 differs"):
        Checkpoint(tmp_path).tensor("a")


def test_a_shard_with_fewer_arrays_than_recorded_is_refused(tmp_path):
    name = _one_shard(tmp_path)
    # (savez adds no suffix to a name ending .npz)
    np.savez(tmp_path / name, a0=np.arange(3.0), a1=np.ones(2))
    _fix_index(tmp_path, name)
    with pytest.raises(CheckpointError,
                       match=rf"shard file {name} is truncated \(expected 3 arrays, read 2\)"):
        Checkpoint(tmp_path).tensor("a")


def test_a_shard_holding_a_pickled_object_array_is_refused_without_running_it(tmp_path):
    name = _one_shard(tmp_path)
    np.savez(tmp_path / name, a0=np.array([{"x": 1}], dtype=object), a1=np.ones(2), a2=np.zeros(4))
    _fix_index(tmp_path, name)
    with pytest.raises(CheckpointError, match=f"shard file {name} holds a pickled object array; refused"):
        Checkpoint(tmp_path).tensor("a")


def test_a_shard_that_is_not_a_zip_is_refused(tmp_path):
    name = _one_shard(tmp_path)
    (tmp_path / name).write_bytes(os.urandom(300))
    _fix_index(tmp_path, name)
    with pytest.raises(CheckpointError, match=f"shard file {name} is not a readable npz"):
        Checkpoint(tmp_path).tensor("a")


def test_foreign_paths_are_refused_as_not_checkpoints(tmp_path):
    (tmp_path / "random.bin").write_bytes(os.urandom(64))
    np.savez(tmp_path / "plain.npz", w=np.ones(2))
    for f in ("random.bin", "plain.npz"):
        with pytest.raises(CheckpointError, match=f"not a virtualpar checkpoint: .*{f} is a file"):
            Checkpoint(tmp_path / f)
    (tmp_path / "d").mkdir()
    with pytest.raises(CheckpointError, match="not a virtualpar checkpoint: missing index.json in"):
        Checkpoint(tmp_path / "d")
    (tmp_path / "d" / INDEX).write_text("{not json")
    with pytest.raises(CheckpointError, match="index.json is not JSON"):
        Checkpoint(tmp_path / "d")
    (tmp_path / "d" / INDEX).write_text(json.dumps({"format": "torch-dcp"}))
    with pytest.raises(CheckpointError, match="has format 'torch-dcp', expected 'virtualpar-checkpoint'"):
        Checkpoint(tmp_path / "d")
    with pytest.raises(CheckpointError, match="no checkpoint at .*: it does not exist"):
        Checkpoint(tmp_path / "nowhere")


def test_writing_refuses_object_arrays_and_a_directory_of_other_files(tmp_path):
    with pytest.raises(CheckpointError, match="tensor 'w' of shard 's' is object"):
        write_checkpoint(tmp_path / "c", {"s": {"w": np.array([None])}}, step=0, layout={})
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match=r"refusing to write a checkpoint into .*\['notes.txt'\]"):
        write_checkpoint(tmp_path / "mine", _shards(), step=0, layout={})
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_a_write_that_fails_midway_leaves_the_old_checkpoint_whole_and_nothing_else(tmp_path, monkeypatch):
    path = tmp_path / "c"
    write_checkpoint(path, _shards(), step=1, layout={})
    before = sorted(os.listdir(path))
    calls = []

    def failing_savez(f, **arrays):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(f, **arrays)

    real = np.savez
    monkeypatch.setattr(np, "savez", failing_savez)
    with pytest.raises(OSError, match="No space left"):
        write_checkpoint(path, _shards(), step=2, layout={})
    assert sorted(os.listdir(path)) == before and Checkpoint(path).step == 1


def test_a_writer_killed_before_its_commit_leaves_the_old_checkpoint_and_the_next_write_cleans_up(tmp_path):
    """A real crash (os._exit at the rename that commits the new index) skips every clean-up."""
    path = tmp_path / "c"
    write_checkpoint(path, _shards(), step=1, layout={})
    old = {k: Checkpoint(path).tensor(k) for k in Checkpoint(path).keys()}
    script = textwrap.dedent(f"""
        import os, numpy as np
        from virtualpar.checkpoint import write_checkpoint
        os.replace = lambda *a: os._exit(3)
        write_checkpoint({str(path)!r}, {{"stage0": {{"model/0.weight": np.zeros((3, 4))}}}},
                         step=9, layout={{}})
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 3, proc.stderr.decode()[-2000:]
    assert any(".9-" in n for n in os.listdir(path))  # the crashed write's files are there...
    ck = Checkpoint(path)  # ...and the old checkpoint reads as it was
    assert ck.step == 1 and all(np.array_equal(ck.tensor(k), v) for k, v in old.items())
    write_checkpoint(path, _shards(), step=3, layout={})
    names = os.listdir(path)
    assert not any(".9-" in n or ".1-" in n or n.startswith(".index") for n in names), names
    assert Checkpoint(path).step == 3


def test_pieces_from_the_index_can_name_a_box_in_a_larger_tensor(tmp_path):
    """A Piece whose offset is given lands there: two row blocks written as two pieces of one shard each."""
    full = np.arange(10, dtype=np.int32)
    write_checkpoint(tmp_path / "c",
                     {"a": {"v": Piece(full[5:], (5,), (10,))}, "b": {"v": Piece(full[:5], (0,), (10,))}},
                     step=0, layout={})
    assert np.array_equal(Checkpoint(tmp_path / "c").tensor("v"), full)


def test_a_state_split_over_tensor_parallel_shards_recuts_into_another_degree(tmp_path):
    """The state of a dp=2 x tp=2 layout (columns of w split over tp; the bias and Adam's step count
    whole, held by every shard; replicas alike) saved, then loaded as tp=4: each shard takes its
    quarter of w and of its slots, the whole bias and step; assembled again, it is the original."""
    from virtualpar.checkpoint import StageState, TrainingState, from_checkpoint, to_shards

    class Adam:  # only the type name and lr are read
        lr = 0.5

    rng = np.random.default_rng(4)
    w, m, b = rng.standard_normal((3, 8)), rng.standard_normal((3, 8)), rng.standard_normal(8)
    cols = lambda i, n: (slice(None), slice(i * 8 // n, (i + 1) * 8 // n))  # noqa: E731
    stages, names = {}, {}
    for dp in range(2):
        for tp in range(2):
            s = 2 * dp + tp
            names[s] = {"w": ("w", cols(tp, 2)), "b": "b"}
            stages[s] = StageState({"w": w[cols(tp, 2)], "b": b},
                                   {"t": 3, "lr": 0.5,
                                    "state": {"w": {"m": m[cols(tp, 2)], "step": np.array(3)}}})
    shards, meta = to_shards(TrainingState(3, stages), names, lambda s: f"rank{s}", Adam(),
                             {"w": (3, 8), "b": (8,)})
    assert list(shards["rank0"]) == ["model/w", "optim/w/m", "optim/w/step", "model/b"]
    assert list(shards["rank1"]) == ["model/w", "optim/w/m"] and shards["rank2"] == shards["rank3"] == {}
    write_checkpoint(tmp_path / "c", shards, step=3, layout={"dp": 2, "tp": 2}, meta=meta)
    ck = Checkpoint(tmp_path / "c")
    assert [p["box"] for p in ck.index["tensors"]["model/w"]["pieces"]] == [
        [[0, 3], [0, 4]],
        [[0, 3], [4, 8]],
    ]
    target = {i: {"w": ("w", cols(i, 4)), "b": "b"} for i in range(4)}
    got = from_checkpoint(ck, target, {"w": w, "b": b}, Adam())
    assert got.step == 3
    for i, st in got.stages.items():
        assert np.array_equal(st.params["w"], w[cols(i, 4)]) and np.array_equal(st.params["b"], b)
        assert np.array_equal(st.optimizer["state"]["w"]["m"], m[cols(i, 4)])
        assert st.optimizer["state"]["w"]["step"] == 3 and (st.optimizer["t"], st.optimizer["lr"]) == (3, 0.5)
    assert np.array_equal(np.concatenate([got.stages[i].params["w"] for i in range(4)], axis=1), w)
