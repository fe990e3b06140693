"""Writing a command's diagram: ``--png`` and ``--html`` for schedule, pipeline and strategy."""

from __future__ import annotations

import argparse
import sys

__all__ = ["write_pictures"]


def write_pictures(diagram, args: argparse.Namespace, command: str) -> int:
    """Write ``diagram`` to ``args.png`` / ``args.html`` (when given), say where on stdout (stderr
    under ``--json``, which keeps stdout one JSON object); 1 when matplotlib is missing for a PNG."""
    note = sys.stderr if getattr(args, "json", False) else sys.stdout
    if args.html:
        diagram.to_html(args.html)
        print(f"diagram: {args.html} (HTML with inline SVG; open in a browser)", file=note)
    if args.png:
        try:
            diagram.to_png(args.png)
        except ImportError as exc:
            print(f"virtualpar {command}: {exc}", file=sys.stderr)
            return 1
        print(f"diagram: {args.png}", file=note)
    return 0
