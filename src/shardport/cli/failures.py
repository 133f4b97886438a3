"""How a failed command is reported: a typed error on stderr (or as JSON), and the last line of defence.

Any exception that is not a :class:`~shardport.ShardportError` is a bug; it becomes an
:class:`~shardport.registry.errors.InternalError` (exit 70) whose traceback goes to a file. A command
stopped by a signal reports it in one line (:func:`interrupted`) and ends by that signal.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shardport import ShardportError
from shardport.registry.errors import InternalError


def _traceback_file(exc: BaseException, argv: Sequence[str]) -> Path | None:
    """Write ``exc``'s traceback to ``$SHARDPORT_HOME/logs/`` (else the temp folder); return its path."""
    import os
    import tempfile
    import time
    import traceback
    import uuid

    from shardport import __version__
    from shardport.registry.home import home

    text = f"shardport {__version__}, python {sys.version.split()[0]}, registry {' '.join(argv)}\n" + "".join(
        traceback.format_exception(exc)
    )
    name = f"internal-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}.txt"
    for folder in (home() / "logs", Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(text)
            return path
        except OSError:
            continue
    return None


def internal(exc: Exception, argv: Sequence[str]) -> InternalError:
    """The last line of defence: an exception nobody anticipated, as an :class:`InternalError`."""
    path = _traceback_file(exc, argv)
    where = f"the traceback is in {path}" if path else "the traceback could not be written (see stderr)"
    if path is None:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    error = InternalError(
        f"unexpected {type(exc).__name__}: {exc} — this is a bug in shardport, not in your input; "
        f"{where}; please attach it to a bug report"
    )
    error.traceback_file = str(path) if path else None
    return error


def report(command: str, exc: ShardportError, json_mode: bool) -> int:
    """Print ``exc`` (one JSON document under ``--json``) and return its exit code."""
    if json_mode:
        body: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc), "exit_code": exc.exit_code}
        traceback_file = getattr(exc, "traceback_file", None)
        if traceback_file:
            body["traceback_file"] = traceback_file
        print(json.dumps({"error": body}))
    else:
        print(f"registry {command}: error: {exc}", file=sys.stderr)
    return exc.exit_code


def stopped_by(exc: BaseException) -> int | None:
    """The signal that stopped the command, if ``exc`` is (or was raised while handling) one.

    A signal's exception raised inside a C extension's call can come back wrapped (Ray's ``wait``
    returns a ``SystemError`` whose context is the :class:`~shardport.registry.output.staging.StopSignal` the
    handler raised).
    """
    from shardport.registry.output.staging import StopSignal

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, StopSignal):
            return current.signum
        if isinstance(current, KeyboardInterrupt):
            return int(signal.SIGINT)
        current = current.__cause__ or current.__context__
    return None


def interrupted(command: str, signum: int, json_mode: bool) -> None:
    """Report in one line that ``command`` was stopped by ``signum`` (what it started is torn down).

    The process then ends by that signal (the shell shows 128 + n: 130 for Ctrl-C, 143 for SIGTERM).
    """
    name = signal.Signals(signum).name
    message = f"interrupted by {name}: stopped, and what it had started was torn down"
    if json_mode:
        body = {"type": "Interrupted", "message": message, "exit_code": 128 + signum}
        print(json.dumps({"error": body}), flush=True)
    else:
        print(f"registry {command}: {message}", file=sys.stderr, flush=True)
