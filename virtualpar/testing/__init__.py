"""Testing parallel code with pytest: the ``virtualpar`` pytest plugin (:mod:`.plugin`), its leak
check (:mod:`.leaks`) and failure reports (:mod:`.report`).

The plugin is registered through the ``pytest11`` entry point, so installing virtualpar enables it;
without the entry point, ``pytest -p virtualpar.testing.plugin`` loads it.
"""

from __future__ import annotations

__all__: list[str] = []
