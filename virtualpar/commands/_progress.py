"""Progress bars for commands whose work can pass 2 s (tqdm, on stderr, only when it is a terminal).

The library never draws: a long library loop takes an optional ``progress`` callback, and the
command passes one of these bars' ``update``.  Piped or redirected, stderr gets nothing (a log of
carriage returns helps nobody), and stdout, which carries the results, is never touched.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["bar", "Bar", "start_cluster", "START_BAR_AT"]


class Bar:
    """A progress bar of ``total`` steps (None: unknown until :meth:`total` is given), or nothing
    when stderr is not a terminal.  Use as a context manager; call it to advance one step."""

    def __init__(self, total: int | None, desc: str, unit: str) -> None:
        self._bar: Any = None
        if not _is_terminal(sys.stderr):
            return
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=desc, unit=f" {unit}", file=sys.stderr, leave=False,
                         dynamic_ncols=True, disable=False)

    def __call__(self, total: int | None = None) -> None:
        """``bar(n)`` sets the total (once known); ``bar()`` advances one step."""
        if self._bar is None:
            return
        if total is not None:
            self._bar.reset(total=total)
        else:
            self._bar.update(1)

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.close()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def bar(total: int | None, desc: str, unit: str = "step") -> Bar:
    """A :class:`Bar` on stderr when it is a terminal, else one that does nothing."""
    return Bar(total, desc, unit)


#: Clusters of at least this many devices show their start on a bar (128 devices take ~1.4 s to
#: start on 2 idle cores, more under load or with spawn; 8 take ~0.05 s).
START_BAR_AT = 64


def start_cluster(mesh: Any, **options: Any) -> Any:
    """``VirtualCluster(mesh, **options)``, with a bar counting the devices ready when the mesh has
    :data:`START_BAR_AT` devices or more and stderr is a terminal."""
    from .. import VirtualCluster

    if mesh.size < START_BAR_AT:
        return VirtualCluster(mesh, **options)
    with bar(mesh.size, f"starting {mesh.size} devices", "device") as ready:
        return VirtualCluster(mesh, progress=ready, **options)
