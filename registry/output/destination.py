"""Where a pull may write: the DEST rules, checked before anything is downloaded and again at publish.

A full pull replaces DEST as a whole, so DEST must be one of:

- a path that does not exist yet (its parent folders are created);
- an empty folder;
- an earlier pull (``.shardport/ref.json`` is there) holding nothing but the files its own
  ``.shardport/manifest.json`` lists;
- with ``force``: any other folder, which is replaced with everything in it.

Never, even with ``force``: the file system root, the home folder, the current folder or a folder
containing it, the store or shardport's home folder (or a folder inside or containing either), a
symbolic link, or something that is not a folder. A per-rank pull only adds or replaces its own files
in DEST, so DEST may hold anything, but must not be (or be inside) the store or shardport's home.

One output file (``registry up --logits-out/--report``: :func:`file_destination`) follows the same
rules for one file: a path that does not exist yet in an existing, writable folder, or a regular file
to replace; never a symbolic link, a folder, a device, a named pipe or a socket, and never the store
or shardport's home (or anything inside them). It is written atomically (:mod:`.writers`).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from shardport.registry.checkpoint.describe import METADATA_DIR
from shardport.registry.errors import UsageError
from shardport.registry.home import home as shardport_home


def canonical(dest: Path) -> Path:
    """``dest`` made absolute, its parent folders resolved (DEST itself, if a link, is not followed).

    A link loop on the way (or a path the system cannot resolve) is a :class:`UsageError` naming it.
    """
    absolute = dest.absolute()
    try:
        if absolute.name in ("", ".", ".."):
            return absolute.resolve()
        return absolute.parent.resolve() / absolute.name
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symbolic link loop (Python < 3.13)
        raise UsageError(f"{dest}: cannot resolve the path ({exc}); name one without a link loop") from exc


def _relation(where: Path, other: Path) -> str | None:
    if where == other:
        return "is"
    if where in other.parents:
        return "contains"
    if other in where.parents:
        return "is inside"
    return None


def _resolved(path: Path | str) -> Path | None:
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError):  # no home folder, a link loop, a deleted current folder
        return None


def _refuse_store(given: Path, where: Path, store_root: Path | None, writer: str = "a pull") -> None:
    for what, path in (("the store", store_root), ("shardport's home folder", shardport_home())):
        other = _resolved(path) if path is not None else None
        relation = _relation(where, other) if other is not None else None
        if relation is not None:
            advice = "Pull into a folder outside it" if writer == "a pull" else "Write to a path outside it"
            raise UsageError(f"{given}: {relation} {what} ({other}); {writer} never writes there. {advice}")


def _refuse_protected(given: Path, where: Path, store_root: Path | None) -> None:
    if where.parent == where:
        raise UsageError(
            f"{given}: is the file system root; pull replaces DEST as a whole and never the root, even "
            "with --force. Pull into a new folder (e.g. ./model)"
        )
    for what, path in (("the current folder", _resolved(Path.cwd())), ("your home folder", _resolved("~"))):
        if path is None:
            continue
        if where == path or where in path.parents:
            relation = "is" if where == path else "contains"
            raise UsageError(
                f"{given}: {relation} {what} ({path}); pull replaces DEST as a whole and never replaces "
                f"{what} or a folder containing it, even with --force. Pull into a new folder, e.g. "
                f"{path / 'model'}"
            )
    _refuse_store(given, where, store_root)


def _listed(where: Path) -> set[str] | None:
    """The file paths an earlier pull at ``where`` wrote, or None if it is not an earlier pull of ours."""
    meta = where / METADATA_DIR
    try:
        if not stat.S_ISDIR(os.lstat(meta).st_mode) or not stat.S_ISREG(os.lstat(meta / "ref.json").st_mode):
            return None
        doc = json.loads((meta / "manifest.json").read_bytes())
        paths = {f["path"] for f in doc["files"]}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    if not all(isinstance(p, str) for p in paths):
        return None
    return paths | {str(parent) for p in paths for parent in Path(p).parents}


def _foreign(where: Path, listed: set[str]) -> list[str]:
    """Entries under ``where`` (not following links) that the earlier pull did not write."""
    out = []
    for root, dirs, files in os.walk(where):
        rel = Path(root).relative_to(where)
        for name in sorted(dirs) + sorted(files):
            path = str(rel / name)
            link = os.path.islink(os.path.join(root, name))
            if path != METADATA_DIR and (link or path not in listed):
                out.append(path)
        dirs[:] = [d for d in dirs if str(rel / d) in listed and str(rel / d) != METADATA_DIR]
    return out


def _names(entries: list[str]) -> str:
    """``N entries: a, b, c and M more``."""
    count = f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
    shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
    return f"{count}: {shown}"


def full_pull_destination(dest: Path, *, store_root: Path | None, force: bool) -> Path:
    """The absolute DEST a full pull may replace, or a :class:`UsageError` saying why not and what to do."""
    where = canonical(dest)
    _refuse_protected(dest, where, store_root)
    try:
        st = os.lstat(where)
    except FileNotFoundError:
        return where
    except OSError as exc:
        raise UsageError(f"{dest}: cannot be checked ({exc.strerror})") from exc
    if stat.S_ISLNK(st.st_mode):
        raise UsageError(
            f"{dest}: is a symbolic link; pull does not replace links, even with --force "
            "(pull into a new folder, or remove the link)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(
            f"{dest}: exists and is not a folder; pull does not replace it, even with --force "
            "(pull into a new folder, or remove it)"
        )
    if force:
        return where
    entries = sorted(os.listdir(where))
    if not entries:
        return where
    listed = _listed(where)
    if listed is None:
        raise UsageError(
            f"{dest}: is not empty ({_names(entries)}) and is not an earlier pull "
            f"(no {METADATA_DIR}/ref.json). A pull replaces DEST as a whole and does not delete what it "
            f"did not write: pull into a new or empty folder, or pass --force to replace {dest} and "
            "everything in it"
        )
    foreign = _foreign(where, listed)
    if foreign:
        raise UsageError(
            f"{dest}: is an earlier pull but also holds what pull did not write "
            f"({_names(foreign)}). A pull replaces DEST as a whole and does not delete them: move them "
            f"out, pull into a new folder, or pass --force to replace {dest} and everything in it"
        )
    return where


def rank_pull_destination(dest: Path, *, store_root: Path | None) -> Path:
    """The absolute DEST a per-rank pull may add its files to (a folder, or a path to create)."""
    where = canonical(dest)
    real = _resolved(where)  # a rank pull writes into the folder a link DEST points to
    _refuse_store(dest, real or where, store_root)
    if real is not None and real.exists() and not real.is_dir():
        raise UsageError(
            f"{dest}: exists and is not a folder; a per-rank pull writes its files into a folder"
        )
    return where


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def file_destination(dest: Path, *, store_root: Path | None, flag: str) -> Path:
    """The absolute path one output file (``flag``) may be written to, or a :class:`UsageError`.

    Checked before the work that produces the file starts, and again when it is written (the staged
    write refuses anything but a regular file at the final name). A path that does not exist yet must
    sit in an existing, writable folder; an existing one must be a regular file (not followed if a
    link); neither may be, or be inside, the store or shardport's home.
    """
    where = canonical(dest)
    if dest.name in ("", ".", "..") or where.parent == where:
        raise UsageError(f"{flag} {dest}: is a folder; {flag} writes one file (name a file in it)")
    real = _resolved(where.parent)
    _refuse_store(dest, real / where.name if real is not None else where, store_root, flag)
    parent = where.parent
    try:
        folder = os.stat(parent)
    except OSError as exc:
        raise UsageError(f"{flag} {dest}: its folder {parent} does not exist ({exc.strerror})") from exc
    if not stat.S_ISDIR(folder.st_mode):
        raise UsageError(f"{flag} {dest}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {dest}: its folder {parent} is not writable")
    try:
        st = os.lstat(where)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UsageError(f"{flag} {dest}: cannot be checked ({exc.strerror})") from exc
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UsageError(
            f"{flag} {dest}: exists and is {_kind(st.st_mode)}; {flag} replaces only a regular file "
            "(name a new file, or remove it)"
        )
    return where
