"""The virtualpar part of a failed test's report: the failing device, the text timeline of the
failed run, and every device's flight-recorder tail.

Built from what a cluster keeps after a failure: the trace events of the run (a recoverable
failure leaves the cluster open; a fatal one leaves no timeline) and the flight records, which
survive the devices and the cluster (``cluster.flight_records``).
"""

from __future__ import annotations

import logging
from typing import Any

from ..runtime.recorder import format_records

__all__ = ["failure_report", "FLIGHT_TAIL"]

log = logging.getLogger(__name__)

FLIGHT_TAIL = 6  # flight records shown per device


def _device_line(err: BaseException | None) -> str:
    rank = getattr(err, "rank", None)
    if rank is None:
        return f"failed in the driver: {type(err).__name__}: {err}" if err is not None else "failed"
    index = getattr(err, "index", None)
    where = f"device {rank}" + (
        f" {index}" if index and not str(index).startswith("(") else f" {index or ''}"
    )
    cause = err.__cause__
    tb = f"\nremote traceback of device {rank}:\n{cause}" if cause is not None else ""
    return f"failed on {where.strip()}: {type(err).__name__}{tb}"


def _other_failures(err: BaseException | None) -> list[str]:
    """The devices besides ``err``'s own that failed on their own in the same run (not by the abort)."""
    failures = getattr(err, "device_failures", None) or {}
    return [_device_line(e).replace("failed on", "also failed on", 1)
            for rank, e in failures.items() if rank != getattr(err, "rank", None)]


def failure_report(clusters: list[Any], err: BaseException | None, width: int = 100) -> str:
    """The report text for a test that failed with ``err`` after using ``clusters``: the failing
    device first, then every other device that failed on its own, then timelines and flight tails."""
    parts = [_device_line(err), *_other_failures(err)]
    for k, cluster in enumerate(clusters):
        name = f"cluster {k} {cluster.mesh}" if len(clusters) > 1 else f"cluster {cluster.mesh}"
        if cluster.closed:
            parts.append(f"{name}: closed after the failure, no timeline")
        else:
            try:
                trace = cluster.trace()
                text = (
                    trace.to_text(width=width)
                    if len(trace)
                    else "(no op of the failed run completed, as in a deadlock: the flight recorder below "
                    "shows where each device was)"
                )
                parts.append(f"{name}, timeline of the failed run:\n{text}")
            except Exception as exc:  # a report must never hide the test's own failure
                log.info("no timeline for %s: %s", name, exc)
                parts.append(f"{name}: no timeline ({type(exc).__name__}: {exc})")
        tails = [f"  device {r} "
                 f"{cluster.mesh.index(r)}:\n{format_records(cluster.flight_records(r), FLIGHT_TAIL)}"
                 for r in range(cluster.size)]
        parts.append(f"{name}, flight recorder (last {FLIGHT_TAIL} ops per device):\n" + "\n".join(tails))
    return "\n\n".join(parts)
