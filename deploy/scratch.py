"""A bring-up's private folder (``/tmp/sp-ray-*``, mode 0700), which records its owner.

It holds Ray's session files, the cluster token and the ranks' rendezvous file. The owner
(``owner.pid``: the driver's pid and start time) lets a later bring-up remove the folders of drivers
that died without cleaning up (SIGKILL, a crash, a power cut), and never one whose driver still runs
(:func:`sweep`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

PREFIX = "sp-ray-"
OWNER = "owner.pid"


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
    return fields[19] if len(fields) > 19 else None


def make(parent: str = "/tmp") -> Path:  # noqa: S108 - a private folder (mkdtemp, 0700)
    """A fresh private folder (0700) owned by this process, its owner recorded."""
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    folder.chmod(0o700)
    pid = os.getpid()
    fd = os.open(folder / OWNER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"{pid} {_started(pid) or ''}\n")
    return folder


def owner_alive(folder: Path) -> bool | None:
    """Whether the process that made ``folder`` still runs (None: no owner recorded, not ours to judge)."""
    try:
        text = (folder / OWNER).read_text(encoding="ascii").split()
        pid = int(text[0])
    except (OSError, ValueError, IndexError):
        return None
    started = _started(pid)
    if started is None:
        return False
    return len(text) < 2 or text[1] == started  # a recycled pid has another start time


def holders(folder: Path) -> list[int]:
    """The processes of this user that hold a file open under ``folder`` (``/proc/PID/fd``).

    After a driver was SIGKILLed, Ray's GCS, raylet and rank processes follow it, but its dashboard and
    runtime-env agents were seen to live on, holding their log files in the folder.
    """
    prefix = str(folder) + os.sep
    uid, found = os.getuid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            links = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if any(link.startswith(prefix) for link in links):
            found.append(int(entry.name))
    return found


def sweep(parent: str = "/tmp") -> list[Path]:  # noqa: S108 - only this user's folders
    """Remove this user's ``sp-ray-*`` folders whose recorded owner is dead; the folders removed.

    The processes still holding files in such a folder (left over from its driver) are killed first. A
    folder without an owner record (made by something else), or another user's, is left alone.
    """
    removed = []
    uid = os.getuid()
    with contextlib.suppress(OSError):
        for folder in Path(parent).glob(f"{PREFIX}*"):
            try:
                if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != uid:
                    continue
            except OSError:
                continue
            if owner_alive(folder) is False:
                for pid in holders(folder):  # what its dead driver left running
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed
