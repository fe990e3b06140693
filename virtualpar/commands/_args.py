"""Argument types shared by the subcommands."""

from __future__ import annotations

import argparse

__all__ = ["default_hardware", "parse_mesh", "parse_costs", "positive_int", "positive_ints", "positive_float",
           "positive_number",
           "output_file", "natural_int", "hardware_choices", "usage_error", "check_cost_kinds", "png_file",
           "add_picture_args"]


def positive_int(text: str) -> int:
    """A count given on the command line: an int >= 1 (argparse names the option when it is not:
    ``argument --steps: must be an int >= 1, got 0``)."""
    return _int_at_least(text, 1)


def natural_int(text: str) -> int:
    """A byte count or seed given on the command line: an int >= 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be an int >= {low}, got {value}")
    return value


def positive_ints(text: str) -> list[int]:
    """A comma-separated list of counts, e.g. ``8,16,32``."""
    return [positive_int(part.strip()) for part in text.split(",")]


def positive_float(text: str) -> float:
    """Seconds given on the command line: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def positive_number(text: str) -> float:
    """A quantity given on the command line (a learning rate, GiB of memory): a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def probability(text: str) -> float:
    """A dropout rate given on the command line: a number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1), got {text}")
    return value


def parse_mesh(text: str):
    """``dp=2,tp=2`` -> ``Mesh({"dp": 2, "tp": 2})``; argparse reports a malformed value, an axis
    named twice or a size the mesh refuses, with the reason."""
    from ..errors import MeshError
    from ..mesh import Mesh

    shape: dict[str, int] = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        name = name.strip()
        try:
            value = int(size)
        except ValueError:
            raise argparse.ArgumentTypeError(f"mesh must look like dp=2,tp=2; got {text!r}") from None
        if name in shape:
            raise argparse.ArgumentTypeError(f"mesh axis {name!r} is given twice in {text!r}")
        shape[name] = value
    try:
        return Mesh(shape)
    except MeshError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def output_file(path: str) -> str:
    """A file the command will write: its folder must exist, checked before any work is done."""
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"cannot write {path!r}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"cannot write {path!r}: it is a folder")
    return path


def parse_costs(text: str) -> dict[str, float]:
    """``F=1,B=2,W=0`` -> ``{"F": 1.0, "B": 2.0, "W": 0.0}``; a kind other than F, B, I, W or a cost
    that is not a finite number >= 0, or a kind given twice, is refused (argparse reports it)."""
    from ..errors import UsageError
    from ..pipeline.simulate import check_costs

    costs: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() in costs:  # B=1,B=2 kept the last: say it instead
            raise argparse.ArgumentTypeError(f"costs give {name.strip()} twice: {text!r}")
        try:
            costs[name.strip()] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"costs must look like F=1,B=2; got {text!r}") from None
    try:
        check_costs(costs, "")
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return costs


def default_hardware(given: str | None, size: int) -> str | None:
    """The preset to model: the one asked for, else one 8-GPU node, a cluster of them for a
    multiple of 8, or (None) the mesh's own fully connected NVLink-class links for other sizes."""
    if given:
        return given
    return "h100-node" if size <= 8 else "h100-cluster" if size % 8 == 0 else None


def hardware_choices() -> tuple[str, ...]:
    """The modelled-hardware presets, for ``--hardware``'s ``choices`` (argparse lists them in
    ``--help`` and refuses any other name with exit 2)."""
    from ..sim.hardware import HARDWARE

    return tuple(HARDWARE)


def usage_error(command: str, message: str) -> int:
    """Report a usage error found after parsing as argparse reports one (``virtualpar CMD: error:
    ...`` on stderr) and return its exit code, 2."""
    import sys

    print(f"virtualpar {command}: error: {message}", file=sys.stderr)
    return 2


def check_cost_kinds(costs: dict[str, float] | None, runs: tuple[str, ...], what: str) -> str | None:
    """The message refusing a kind ``what`` never runs (``runs``: the kinds it does), else None:
    a B cost for zb_h1, which splits the backward into I and W, would be silently ignored."""
    if not costs:
        return None
    unused = [k for k in costs if k not in runs]
    if not unused:
        return None
    why = " (it splits the backward B into I, the input gradient, and W, the weight gradient)" \
        if "I" in runs and "B" in unused else " (it runs the backward whole, as B)" if "B" in runs else ""
    return (f"--costs gives {', '.join(unused)}, which {what} never runs{why}; it runs {', '.join(runs)}: "
            f"give costs for those only")


def png_file(path: str) -> str:
    """A PNG to write: like :func:`output_file`, and the name ends in ``.png``."""
    output_file(path)
    if not path.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"{path!r} is not a .png file name (for a self-contained picture "
                                         f"without matplotlib, use --html FILE.html)")
    return path


def add_picture_args(p: argparse.ArgumentParser, what: str) -> None:
    """``--png FILE`` and ``--html FILE``: the diagram of ``what`` (ranks as rows, time along x)."""
    p.add_argument("--png", type=png_file, default=None, metavar="FILE.png",
                   help=f"write the diagram of {what} as a PNG (needs matplotlib: "
                        "pip install virtualpar[viz])")
    p.add_argument("--html", type=output_file, default=None, metavar="FILE.html",
                   help=f"write the diagram of {what} as a self-contained HTML page (inline SVG, "
                        "no dependency)")
