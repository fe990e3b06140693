"""Running ``mpiexec`` from a test without leaving anything in /tmp.

MPICH's process manager (hydra) writes the machine's topology to ``/tmp/hydra_hwloc_xmlfile_*``
for its ranks (a path it does not take from TMPDIR) and removes it only when the job ends
normally: every aborted job left one.  Given ``HWLOC_XMLFILE``, it writes none and the ranks
discover the topology themselves, so each job here gets a private directory as TMPDIR (for
anything else that honours it), ``HWLOC_XMLFILE`` inside it (never created), and the directory is
removed after the job, whatever happened.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Any

__all__ = ["run_mpiexec", "private_env"]


def private_env(tmpdir: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with TMPDIR and HWLOC_XMLFILE inside ``tmpdir``."""
    return dict(os.environ if env is None else env, TMPDIR=tmpdir,
                HWLOC_XMLFILE=os.path.join(tmpdir, "no-topology-file.xml"))


def run_mpiexec(argv: list[str], env: dict[str, str] | None = None,
                **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, ...)`` for an ``mpiexec`` command line, in a private temporary directory."""
    tmpdir = tempfile.mkdtemp(prefix="virtualpar-mpiexec-")
    try:
        return subprocess.run(argv, env=private_env(tmpdir, env), **kwargs)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
