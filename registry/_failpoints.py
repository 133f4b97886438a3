"""Fault injection for crash-safety tests: ``SHARDPORT_FAILPOINT=<name>`` kills the process there.

A failpoint costs one dictionary lookup when the variable is unset. The names mark each write step
of a push: ``blob-written`` (a blob's bytes are staged, not published), ``blobs-done``,
``manifest-written``, ``signature-written``, ``tagdoc-blob-written`` (before the tag document).
"""

from __future__ import annotations

import os
import signal


def hit(name: str) -> None:
    """SIGKILL this process if the failpoint ``name`` is armed."""
    if os.environ.get("SHARDPORT_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
