"""How a failed command is reported: a typed error on stderr (or as JSON), and the last line of defence.

Any exception that is not a :class:`~shardport.ShardportError` is a bug; it becomes an
:class:`~shardport.registry.errors.InternalError` (exit 70) whose traceback goes to a file. A command
stopped by Ctrl-C or SIGTERM unwinds (tearing down what it started) and exits 130 / 143 with one line.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
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


class Terminated(BaseException):
    """SIGTERM asked the command to stop.

    Raised in the main thread, so that the command unwinds (its ``finally`` blocks tear down what it
    started) like Ctrl-C's KeyboardInterrupt, instead of dying.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def terminate_unwinds() -> Iterator[None]:
    """While the block runs (in the main thread), SIGTERM raises :class:`Terminated`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stopped_by(exc: BaseException) -> int | None:
    """The signal that stopped the command, if ``exc`` is (or was raised while handling) one.

    A signal's exception raised inside a C extension's call can come back wrapped (Ray's ``wait``
    returns a ``SystemError`` whose context is the :class:`Terminated` our handler raised).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, Terminated):
            return current.signum
        if isinstance(current, KeyboardInterrupt):
            return int(signal.SIGINT)
        current = current.__cause__ or current.__context__
    return None


def interrupted(command: str, signum: int, json_mode: bool) -> int:
    """Report a command stopped by ``signum`` in one line; return the shell's status for it (128 + n)."""
    name = signal.Signals(signum).name
    message = f"interrupted by {name}: stopped, and what it had started was torn down"
    code = 128 + signum
    if json_mode:
        print(json.dumps({"error": {"type": "Interrupted", "message": message, "exit_code": code}}))
    else:
        print(f"registry {command}: {message}", file=sys.stderr)
    return code
