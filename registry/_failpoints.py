"""Fault injection for crash-safety tests: ``SHARDPORT_FAILPOINT=<name>`` kills the process there.

A failpoint costs one dictionary lookup when the variable is unset. The names mark each write step
of a push: ``blob-written`` (a blob's bytes are staged, not published), ``blobs-done``,
``manifest-written``, ``signature-written``, ``tagdoc-blob-written`` (before the tag document); and
of a pull: ``pull-file-fetched`` (after each file is downloaded into the temporary folder, in the
main thread), ``rank-files-staged`` (a per-rank pull's files are staged, not yet renamed into place);
of ``verify REF``: ``verify-blobs-fetched`` (its temporary copy is complete); of ``gc``:
``gc-marked`` (what to remove is chosen, nothing removed yet), ``gc-blob-removed`` (after each blob).

``SHARDPORT_FAILPOINT=<name>:pause`` sleeps there for a minute instead (then goes on), so that a test
can send the process a signal at that step; ``<name>:term`` sends it SIGTERM there. A bring-up rank
has one at the start of every stage: ``rank<R>-<stage>`` (:meth:`shardport.deploy.rank.Rank._enter`).
With ``SHARDPORT_FAILPOINT_RESUME=PATH`` a pause
creates ``PATH.paused`` on arrival and ends as soon as ``PATH`` exists: a test can run another command
while this one waits at the step, then let it go on.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

PAUSE_SECONDS = 60.0


def hit(name: str) -> None:
    """SIGKILL this process if the failpoint ``name`` is armed (pause if armed as ``name:pause``)."""
    armed = os.environ.get("SHARDPORT_FAILPOINT")
    if armed == name:
        os.kill(os.getpid(), signal.SIGKILL)
    elif armed == f"{name}:pause":
        resume = os.environ.get("SHARDPORT_FAILPOINT_RESUME")
        if not resume:
            time.sleep(PAUSE_SECONDS)
            return
        Path(f"{resume}.paused").touch()
        deadline = time.monotonic() + PAUSE_SECONDS
        while not Path(resume).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    elif armed == f"{name}:term":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(PAUSE_SECONDS)  # a process that handles SIGTERM by unwinding does so here
