"""Subcommands of the ``virtualpar`` command line, one module each.

Every module named in :data:`COMMANDS` exposes ``register(sub)``, which adds its parser to the
``argparse`` sub-parsers ``sub`` and sets ``func`` (a function of the parsed namespace returning an
exit code).  Modules are imported only when the parser is built, so ``import virtualpar`` stays light.
"""

from __future__ import annotations

__all__ = ["COMMANDS"]

COMMANDS: tuple[str, ...] = (
    "virtualpar.commands.tour",
    "virtualpar.commands.schedule",
    "virtualpar.commands.pipeline",
    "virtualpar.commands.policies",
    "virtualpar.commands.strategy",
    "virtualpar.commands.run",
    "virtualpar.commands.doctor",
    "virtualpar.commands.lab",
    "virtualpar.commands.train",
    "virtualpar.commands.plan",

)
