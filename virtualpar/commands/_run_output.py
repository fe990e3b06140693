"""What ``virtualpar run`` prints: each device's result (numpy scalars as numbers, arrays with their
shape and dtype) beside its modelled clock, the ``--stats`` bytes, the ``--trace`` and ``--png``
files, or all of it as one ``--json`` object."""

from __future__ import annotations

import argparse

from ..trace.fmt import fit, seconds
from ._args import default_hardware

__all__ = ["print_run"]


def _shown(value) -> str:
    """A device's result as a person reads it: numpy scalars as plain numbers, arrays with numpy's
    own layout (shape and dtype named), anything else as Python writes it."""
    import numpy as np

    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray):
        body = np.array2string(value, max_line_width=90, threshold=64)
        return f"{value.dtype} array of shape {value.shape}\n{body}" if value.ndim else body
    return repr(value)


def _jsonable(value):
    """A device's result for ``--json``: arrays as nested lists, numpy scalars as numbers, JSON's
    own types as they are, anything else as its repr (a string)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v) for k, v in value.items()}
    return repr(value)


def _json(mesh, results, clocks, stats, trace, args: argparse.Namespace, codes) -> None:
    """``--json``: one object on one line (after anything the devices printed)."""
    import json

    hardware = default_hardware(args.hardware, mesh.size)
    out = {"target": args.target, "mesh": dict(mesh.shape), "hardware": hardware,
           "devices": [{"rank": r, "coords": mesh.index(r).as_dict(), "result": _jsonable(v),
                        "modelled_s": float(c)} for r, (v, c) in enumerate(zip(results, clocks))]}
    if codes is not None:
        out["exit_codes"] = list(codes)
    if args.stats:
        out["stats"] = {"bytes": stats.bytes.tolist(), "messages": stats.messages.tolist(),
                        "host_to_device": stats.host_to_device.tolist(),
                        "device_to_host": stats.device_to_host.tolist(), "unit": "bytes"}
    if args.trace or args.png:
        trace = trace() if callable(trace) else trace
    if args.trace:
        out["trace"] = trace.write_chrome(args.trace)
    if args.png:
        from ..trace.gantt import to_png

        out["png"] = to_png(trace, args.png, clock="model", title=f"virtualpar run {args.target} on {mesh}")
    print(json.dumps(out, allow_nan=False, default=repr))


def print_run(mesh, results, clocks, stats, trace, args: argparse.Namespace, codes=None) -> None:
    if args.json:
        return _json(mesh, results, clocks, stats, trace, args, codes)
    for rank, (value, clock) in enumerate(zip(results, clocks)):
        head, text, tail = f"device {rank} {mesh.index(rank)}:", _shown(value), f"(modelled {seconds(clock)})"
        if "\n" in text or len(head) + len(text) + len(tail) + 4 > args.width:  # the value below, indented
            print(f"{head}   {tail}")
            body = (line for part in text.splitlines() for line in fit(part, args.width - 4))
            print("\n".join("    " + line for line in body))
        else:
            print(f"{head} {text}   {tail}")
    if args.stats:
        print(stats.format(width=args.width))
    if args.trace or args.png:
        trace = trace() if callable(trace) else trace  # the emulator's is fetched only when asked for
    if args.trace:
        print(f"trace: {trace.write_chrome(args.trace)} (open in chrome://tracing or ui.perfetto.dev)")
    if args.png:
        from ..trace.gantt import to_png

        path = to_png(trace, args.png, clock="model", title=f"virtualpar run {args.target} on {mesh}")
        print(f"timeline: {path} (modelled clock)")
