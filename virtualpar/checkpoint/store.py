"""A checkpoint on disk: an ``.npz`` per shard and ``index.json``, written atomically, read running no code.

Layout of a checkpoint directory (torch's distributed checkpoint keeps the same split: a file per
rank and one small metadata file)::

    ckpt/index.json                    format, version, step, layout, meta; per file its size, sha256 and
                                       array count; per tensor its full shape, dtype and pieces
    ckpt/stage0.5-3fa2c1.npz           one shard: arrays a0, a1, ... (``np.savez``, never pickled)
    ckpt/stage1.5-3fa2c1.npz

A tensor's entry lists its pieces as ``{"file", "array", "box": [[start, stop], ...]}``, so a
tensor split along any axis over several files is expressible (see :mod:`.tiles`); a reader
assembles tensors by key and re-splits them for its own layout.

Atomic: shard files get names of their own (``<stem>.<step>-<token>.npz``) and are fsynced; the
index is written to a temporary name, fsynced and renamed over ``index.json`` — the one commit
point — and only then are the files the new index does not name removed.  A crash before the
rename leaves the previous checkpoint whole (its index and files are untouched).

Safe: arrays are read with ``allow_pickle=False``; a file whose size or sha256 differs from the
index, that is not a zip, holds fewer arrays than recorded or an object array, is refused with a
:class:`CheckpointError` naming the file.  Cost: writing is one ``np.savez`` per shard plus one
read-back for the hash; reading verifies each file's hash once, then copies each array once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import VirtualParError
from .tiles import Piece, TileError, assemble

__all__ = ["CheckpointError", "Checkpoint", "write_checkpoint", "FORMAT", "VERSION", "INDEX"]

FORMAT = "virtualpar-checkpoint"
VERSION = 1
INDEX = "index.json"
_STEM = re.compile(r"^[A-Za-z0-9_-]+$")
_OURS = re.compile(r"^[A-Za-z0-9_-]+\.\d+-[0-9a-f]{6}\.npz$|^\.index\.json\.tmp-")


class CheckpointError(VirtualParError, ValueError):
    """A checkpoint that cannot be written or read: not one of ours, truncated, corrupted, or not
    matching the operation it is loaded into."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_target(path: Path) -> None:
    """Write only into a new or empty directory, or over a checkpoint of ours."""
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"cannot write a checkpoint to {path}: it is a file (a checkpoint is a "
                              "directory)")
    if path.is_dir() and not (path / INDEX).exists():
        foreign = [p.name for p in path.iterdir() if not _OURS.match(p.name)]
        if foreign:
            raise CheckpointError(f"refusing to write a checkpoint into {path}: it holds "
                                  f"{sorted(foreign)[:5]} and no {INDEX} (not a virtualpar checkpoint); "
                                  "choose an empty or new directory")


def _entries(shards: Mapping[str, Mapping[str, Any]]) -> dict[str, list[tuple[str, Piece]]]:
    out: dict[str, list[tuple[str, Piece]]] = {}
    for stem, arrays in shards.items():
        if not isinstance(stem, str) or not _STEM.match(stem):
            raise CheckpointError(f"a shard name must be letters, digits, '_' or '-', got {stem!r}")
        items = []
        for key, value in arrays.items():
            piece = value if isinstance(value, Piece) else Piece(np.asarray(value))
            a = np.asarray(piece.array)
            if a.dtype.hasobject or a.dtype.kind not in "biufc":
                raise CheckpointError(f"tensor {key!r} of shard {stem!r} is {a.dtype}: a checkpoint holds "
                                      "numeric arrays only (anything else would need pickle to load)")
            a = a if a.flags.c_contiguous else a.copy(order="C")  # (ascontiguousarray makes a 0-d array 1-d)
            items.append((str(key), Piece(a, piece.start, piece.full_shape)))
        out[stem] = items
    return out


def write_checkpoint(path: str | os.PathLike, shards: Mapping[str, Mapping[str, Any]], *, step: int,
                     layout: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``shards`` ({shard name: {tensor key: array or :class:`Piece`}}) as a checkpoint directory at
    ``path``, atomically (see the module doc); ``layout`` and ``meta`` are JSON values kept in the index."""
    path = Path(path)
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise CheckpointError(f"step must be an int >= 0, got {step!r}")
    entries = _entries(shards)
    _check_target(path)
    path.mkdir(parents=True, exist_ok=True)
    token = f"{int(step)}-{secrets.token_hex(3)}"
    tensors: dict[str, dict[str, Any]] = {}
    files: dict[str, dict[str, Any]] = {}
    written: list[Path] = []
    try:
        for stem, items in entries.items():
            name = f"{stem}.{token}.npz"
            target = path / name
            with open(target, "xb") as f:
                written.append(target)
                np.savez(f, **{f"a{i}": p.array for i, (_, p) in enumerate(items)})
                f.flush()
                os.fsync(f.fileno())
            files[name] = {"bytes": target.stat().st_size, "sha256": _sha256(target), "arrays": len(items)}
            for i, (key, p) in enumerate(items):
                entry = tensors.setdefault(key, {"shape": list(p.full_shape), "dtype": p.array.dtype.str,
                                                 "pieces": []})
                if entry["shape"] != list(p.full_shape) or entry["dtype"] != p.array.dtype.str:
                    raise CheckpointError(f"tensor {key!r} is {entry['dtype']} {tuple(entry['shape'])} in "
                                          f"one shard and {p.array.dtype.str} {p.full_shape} in shard "
                                          f"{stem!r}")
                entry["pieces"].append({"file": name, "array": f"a{i}", "box": p.box()})
        index = {"format": FORMAT, "version": VERSION, "step": int(step), "layout": dict(layout),
                 "meta": dict(meta or {}), "files": files, "tensors": tensors}
        text = json.dumps(index, indent=1, sort_keys=True)
        tmp = path / f".index.json.tmp-{token}"
        with open(tmp, "x") as f:
            written.append(tmp)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path / INDEX)  # the commit point
        written.remove(tmp)
        _fsync_dir(path)
    except BaseException:
        for p in written:  # the old index and its files were never touched
            try:
                p.unlink()
            except OSError:
                pass
        raise
    for p in path.iterdir():  # the previous checkpoint's files, and leftovers of a write that crashed
        if _OURS.match(p.name) and p.name not in files:
            p.unlink(missing_ok=True)
    return path


class Checkpoint:
    """A checkpoint directory opened for reading: ``step``, ``layout``, ``meta``, ``keys()``, and
    ``tensor(key)`` (the full tensor, assembled from its pieces).  Opening reads only the index."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = path = Path(path)
        if not path.exists():
            raise CheckpointError(f"no checkpoint at {path}: it does not exist")
        if not path.is_dir():
            raise CheckpointError(f"not a virtualpar checkpoint: {path} is a file (a checkpoint is a "
                                  f"directory holding {INDEX})")
        if not (path / INDEX).is_file():
            raise CheckpointError(f"not a virtualpar checkpoint: missing {INDEX} in {path}")
        try:
            index = json.loads((path / INDEX).read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"not a virtualpar checkpoint: {path / INDEX} is not JSON ({exc})") \
                from None
        if not isinstance(index, dict) or index.get("format") != FORMAT:
            got = index.get("format") if isinstance(index, dict) else type(index).__name__
            raise CheckpointError(f"not a virtualpar checkpoint: {path / INDEX} has format {got!r}, "
                                  f"expected {FORMAT!r}")
        if not isinstance(index.get("version"), int) or index["version"] > VERSION:
            raise CheckpointError(f"checkpoint {path} has format version {index.get('version')!r}; this "
                                  f"virtualpar reads versions up to {VERSION}")
        for field in ("step", "layout", "meta", "files", "tensors"):
            if field not in index:
                raise CheckpointError(f"checkpoint index {path / INDEX} lacks the field {field!r}")
        self.index = index
        self.step: int = int(index["step"])
        self.layout: dict[str, Any] = index["layout"]
        self.meta: dict[str, Any] = index["meta"]
        self._files: dict[str, dict[str, np.ndarray]] = {}

    def keys(self) -> list[str]:
        return list(self.index["tensors"])

    def __contains__(self, key: str) -> bool:
        return key in self.index["tensors"]

    def tensor(self, key: str) -> np.ndarray:
        """The full tensor ``key``, from every piece of it in every file."""
        entry = self.index["tensors"].get(key)
        if entry is None:
            keys = self.keys()
            raise CheckpointError(f"checkpoint {self.path} holds no tensor {key!r}; it holds {len(keys)}: "
                                  f"{keys[:8]}{' ...' if len(keys) > 8 else ''}")
        pieces = [(p["box"], self._array(p["file"], p["array"], key)) for p in entry["pieces"]]
        try:
            return assemble(key, entry["shape"], np.dtype(entry["dtype"]), pieces)
        except TileError as exc:
            raise CheckpointError(f"checkpoint {self.path}: {exc.message}") from None

    def _array(self, name: str, member: str, key: str) -> np.ndarray:
        arrays = self._files.get(name)
        if arrays is None:
            arrays = self._files[name] = self._read(name)
        if member not in arrays:
            raise CheckpointError(f"shard file {name} holds no array {member!r} (tensor {key!r})")
        return arrays[member]

    def _read(self, name: str) -> dict[str, np.ndarray]:
        info = self.index["files"].get(name)
        target = self.path / name
        if info is None:
            raise CheckpointError(f"checkpoint {self.path}: a tensor names the file {name}, which the index "
                                  "does not list")
        if not target.is_file():
            raise CheckpointError(f"shard file {name} listed in {self.path / INDEX} is missing")
        size = target.stat().st_size
        if size < info["bytes"]:
            raise CheckpointError(f"shard file {name} is truncated (expected {info['bytes']} bytes, found "
                                  f"{size})")
        if size != info["bytes"]:
            raise CheckpointError(f"shard file {name} has {size} bytes, the index says {info['bytes']}")
        if _sha256(target) != info["sha256"]:
            raise CheckpointError(f"shard file {name} is corrupted: its sha256 differs from the index's")
        if not zipfile.is_zipfile(target):  # np.load would take it for a pickle (and refuse it as one)
            raise CheckpointError(f"shard file {name} is not a readable npz (not a zip archive)")
        out: dict[str, np.ndarray] = {}
        try:
            with np.load(target, allow_pickle=False) as npz:
                for member in npz.files:
                    out[member] = npz[member]
        except ValueError as exc:
            if "allow_pickle" in str(exc):
                raise CheckpointError(f"shard file {name} holds a pickled object array; refused (loading it "
                                      "would run code)") from None
            raise CheckpointError(f"shard file {name} cannot be read as npz: {exc}") from None
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise CheckpointError(f"shard file {name} is not a readable npz ({type(exc).__name__}: "
                                  f"{exc})") from None
        if len(out) < info["arrays"]:
            raise CheckpointError(f"shard file {name} is truncated (expected {info['arrays']} arrays, "
                                  f"read {len(out)})")
        return out
