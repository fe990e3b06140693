"""What a run left behind: messages sent and never received, receives posted and never matched.

After a successful run the rings must be empty.  The driver asks every device what it still holds
(``pending``), merges that with what the run's replies listed, resets the cluster, and raises
``UnmatchedMessages`` naming each leftover, so nothing is silently carried into the next run.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .._words import counted, plural
from ..errors import UnmatchedMessages
from ..transport.leftovers import UNFINISHED_RECEIVE, merge_ends

__all__ = ["report_unmatched"]


def report_unmatched(ctl: Any, found: list[tuple]) -> None:
    """Reset ``ctl``'s cluster and raise ``UnmatchedMessages`` for what ``found`` and the devices list."""
    asked: Counter = Counter()
    for r in range(ctl.size):
        asked.update(ctl.command(r, ("pending",)))
    # the run's replies and the devices asked again list the same leftovers: each as often as
    # the longer list has it (two identical sends are two messages, not one)
    found = merge_ends(sorted((Counter(found) | asked).elements()))
    ctl.reset()
    if found:
        sent = [f"  device {s} -> device {d}, tag {t}: {desc}"
                for s, d, t, desc in found if desc != UNFINISHED_RECEIVE]
        posted = [f"  device {d} <- {'any device' if s < 0 else f'device {s}'}, "
                  f"{'any tag' if t < 0 else f'tag {t}'}: {desc}"
                  for s, d, t, desc in found if desc == UNFINISHED_RECEIVE]
        head = []
        if sent:
            head.append(f"{counted(len(sent), 'message')} {plural(len(sent), 'was', 'were')} sent and never "
                        "received")
        if posted:
            head.append(f"{counted(len(posted), 'receive')} {plural(len(posted), 'was', 'were')} posted and "
                        "never completed")
        raise UnmatchedMessages(f"{' and '.join(head)} by the end of the run:\n" + "\n".join(sent + posted),
                                messages=found)
