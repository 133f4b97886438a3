"""Temporary names a pull stages under, who owns them, and cleaning up after a stopped pull.

A pull writes under a temporary name that records its owner::

    .<name>.<kind>-<host>-<pid>-<random>

``kind`` is ``pull`` for a full pull's folder beside DEST and ``part`` for a file staged inside a
folder (rank pulls); ``host`` is 8 hex digits of the SHA-256 of the host name, ``pid`` the owning
process. :func:`remove_stale` (called by the next pull into the same folder) removes the ones whose
owner is gone: this host's, a process that no longer exists, owned by this user, and of their kind (a
real folder for ``pull``, a regular file for ``part``; a link is never followed or removed). One whose
process is alive, or that another host made (a shared file system), is kept.

:func:`stop_on_signals` turns SIGTERM and SIGHUP into an exception in the main thread while a pull
runs, so the pull's own clean-up removes what it staged; afterwards the signal is raised again with
the previous handler back in place, and the process ends as it would have.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import stat
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Literal

Kind = Literal["pull", "part"]

_STAGED = re.compile(
    r"\.(?P<name>.+)\.(?P<kind>pull|part)-(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]{1,10})-[0-9a-f]{12}", re.S
)
_STOPPING = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def temp_name(name: str, kind: Kind) -> str:
    """A fresh temporary name for ``name`` owned by this process on this host."""
    return f".{name}.{kind}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` may exist (anything but a clear "no such process" counts as alive)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # EPERM: it exists, as another user's process
        return True
    return True


def stale(name: str, kind: Kind) -> bool:
    """Whether ``name`` is a ``kind`` temporary name of this host whose owning process is gone."""
    found = _STAGED.fullmatch(name)
    return (
        found is not None
        and found["kind"] == kind
        and found["host"] == _host()
        and not _alive(int(found["pid"]))
    )


def remove_stale(folder: Path, kind: Kind, *, dir_fd: int | None = None) -> list[str]:
    """Remove the stale ``kind`` temporary names directly in ``folder``; return the names removed.

    With ``dir_fd`` (an open descriptor of ``folder``), names are looked up relative to it.
    """
    try:
        names = os.listdir(folder if dir_fd is None else dir_fd)
    except OSError:
        return []
    removed = []
    for name in names:
        if not stale(name, kind):
            continue
        try:
            st = os.stat(name if dir_fd is not None else folder / name, dir_fd=dir_fd, follow_symlinks=False)
            if st.st_uid != os.geteuid():
                continue
            if kind == "pull" and stat.S_ISDIR(st.st_mode) and dir_fd is None:
                shutil.rmtree(folder / name)
            elif kind == "part" and stat.S_ISREG(st.st_mode):
                os.unlink(name if dir_fd is not None else folder / name, dir_fd=dir_fd)
            else:
                continue
        except OSError:  # another pull is cleaning the same name up
            continue
        removed.append(name)
    return removed


def block_stopping_signals() -> None:
    """A worker thread's initializer: SIGTERM, SIGHUP and SIGINT are delivered to the main thread only.

    The kernel hands a process-directed signal to any thread that does not block it; one handed to a
    download worker would not interrupt the main thread's blocking call (a wait, a sleep), so
    :func:`stop_on_signals`' handler would run only once that call returned, possibly much later.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPPING)


class StopSignal(BaseException):
    """A stopping signal (SIGTERM, SIGHUP, or SIGINT without Python's handler) arrived while a pull ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise :class:`StopSignal` in the main thread.

    Only signals left at their default action are taken over (a program's own handler stays in
    charge), and only in the main thread (elsewhere this does nothing); SIGINT is taken over only
    where Python's own ``KeyboardInterrupt`` handler is not installed. A second signal while the
    block cleans up is ignored; when the block has ended, the previous handlers are restored and the
    first signal is raised again, so the process ends with that signal's status as it would have
    without the clean-up.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if not caught:
            caught.append(signum)
            raise StopSignal(signum)

    previous = {}
    for sig in _STOPPING:
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        if caught:
            signal.raise_signal(caught[0])
