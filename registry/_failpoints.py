"""Fault injection for crash-safety tests: ``SHARDPORT_FAILPOINT=<name>`` kills the process there.

A failpoint costs one dictionary lookup when the variable is unset. The names mark each write step
of a push: ``blob-written`` (a blob's bytes are staged, not published), ``blobs-done``,
``manifest-written``, ``signature-written``, ``tagdoc-blob-written`` (before the tag document); and
of a pull: ``pull-file-fetched`` (after each file is downloaded into the temporary folder, in the
main thread), ``rank-files-staged`` (a per-rank pull's files are staged, not yet renamed into place);
of ``verify REF``: ``verify-blobs-fetched`` (its temporary copy is complete).

``SHARDPORT_FAILPOINT=<name>:pause`` sleeps there for a minute instead (then goes on), so that a test
can send the process a signal at that step; ``<name>:term`` sends it SIGTERM there. A bring-up rank
has one at the start of every stage: ``rank<R>-<stage>`` (:meth:`shardport.deploy.rank.Rank._enter`).
"""

from __future__ import annotations

import os
import signal
import time

PAUSE_SECONDS = 60.0


def hit(name: str) -> None:
    """SIGKILL this process if the failpoint ``name`` is armed (pause if armed as ``name:pause``)."""
    armed = os.environ.get("SHARDPORT_FAILPOINT")
    if armed == name:
        os.kill(os.getpid(), signal.SIGKILL)
    elif armed == f"{name}:pause":
        time.sleep(PAUSE_SECONDS)
    elif armed == f"{name}:term":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(PAUSE_SECONDS)  # a process that handles SIGTERM by unwinding does so here
