"""``virtualpar lab list | start NAME [DIR] | check NAME [FILE] [--json] [--png DIR]``: graded exercises.

``list`` shows each lab's goal, concept and difficulty; ``start`` writes the lab's skeleton (the
function to write, the task, the rules, how it is checked) and its ``LAB.md`` background into DIR;
``check`` runs the student's file on virtual clusters against hidden cases and prints what is
right and wrong — or, with ``--json``, one Gradescope-style object.  The exit status is 0 only at
full score.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ._args import usage_error

__all__ = ["register"]


def _list(args: argparse.Namespace) -> int:
    from ..labs import available
    from ..trace.fmt import table

    labs = available()
    if args.json:
        print(json.dumps([{"name": lab.name, "goal": lab.goal, "concept": lab.concept,
                           "difficulty": lab.difficulty}
                          for lab in labs.values()], indent=2))
        return 0
    print(table(["lab", "level", "goal, and the concept it teaches"],
                [[lab.name, lab.difficulty, f"{lab.goal}. Concept: {lab.concept}"] for lab in labs.values()],
                width=args.width))
    print("\nstart one with: virtualpar lab start NAME [DIR]")
    return 0


def _lab(args: argparse.Namespace):
    """The lab named on the command line; an unknown name is a usage error (exit 2)."""
    from ..errors import UsageError
    from ..labs import get

    try:
        return get(args.name)
    except UsageError as exc:
        raise SystemExit(usage_error(f"lab {args.lab_command}", str(exc))) from None


def _start(args: argparse.Namespace) -> int:
    lab = _lab(args)
    directory = args.dir or lab.name
    written = lab.start(directory)
    for path in written:
        print(f"wrote {path}")
    print(f"\nnext: read {written[1]}, fill in {written[0]}, then\n"
          f"  virtualpar lab check {lab.name} {written[0]}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from ..labs import CheckOptions

    lab = _lab(args)
    path = args.file or os.path.join(lab.name, lab.student_file)
    if not os.path.isfile(path):
        return usage_error("lab check",
                           f"no such file {path!r}: write your solution there (virtualpar lab start "
                                        f"{lab.name} writes the skeleton)")
    if args.png:
        os.makedirs(args.png, exist_ok=True)
    report = lab.check(path, CheckOptions(png=args.png, width=args.width))
    if args.json:
        print(json.dumps(report.to_gradescope(), indent=2))
    else:
        print(report.format(width=args.width))
    return 0 if report.passed else 1


def register(sub) -> None:
    p = sub.add_parser("lab", help="graded exercises: list, start and check labs",
                       description=__doc__.split("\n\n")[1].replace("``", "'"))
    lab_sub = p.add_subparsers(dest="lab_command", required=True)
    q = lab_sub.add_parser("list", help="the labs, with their goal, concept and difficulty")
    q.add_argument("--json", action="store_true", help="the list as JSON")
    q.add_argument("--width", type=int, default=100, help="columns of the table (default 100)")
    q.set_defaults(func=_list)
    q = lab_sub.add_parser("start", help="write a lab's skeleton and background into DIR")
    q.add_argument("name", help="the lab (see: virtualpar lab list)")
    q.add_argument("dir", nargs="?", help="where to write it (default: a folder named after the lab)")
    q.set_defaults(func=_start)
    q = lab_sub.add_parser("check", help="grade a solution against the lab's hidden cases")
    q.add_argument("name", help="the lab (see: virtualpar lab list)")
    q.add_argument("file", nargs="?", help="the solution (default: NAME/NAME.py, as lab start writes it)")
    q.add_argument("--json", action="store_true", help="one Gradescope-style object: score, max_score, tests")
    q.add_argument("--png", metavar="DIR",
                   help="also draw your run and the reference's timelines as PNGs in DIR")
    q.add_argument("--width", type=int, default=min(100, max(60, _columns())),
                   help="columns of the text output (default: the terminal's, at most 100)")
    q.set_defaults(func=_check)


def _columns() -> int:
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError):
        return 100
