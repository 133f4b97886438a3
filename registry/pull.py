"""Pull an artifact into a folder.

Verify first, download and hash-check into a temporary folder, then publish it at DEST in one
rename. A failed or interrupted pull leaves DEST as it was.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from shardport.registry.analysis import check_stored
from shardport.registry.describe import METADATA_DIR
from shardport.registry.errors import DigestMismatchError, UnsafePathError, UsageError
from shardport.registry.manifest import FileEntry
from shardport.registry.paths import check_paths
from shardport.registry.progress import Quiet, Reporter
from shardport.registry.refs import Ref
from shardport.registry.resolve import Resolved, resolve
from shardport.registry.session import Session
from shardport.registry.signatures import SIGNATURE_ARTIFACT, referrers
from shardport.registry.witness_file import FOLDER_NAME as WITNESS_FILE
from shardport.registry.witness_file import load_producer

WORKERS = 4
_RENAME_EXCHANGE = 2


@dataclass(frozen=True)
class PullResult:
    """What a pull did."""

    ref: str
    digest: str
    dest: Path
    files: int
    bytes: int
    tag_version: int | None

    def to_json(self) -> dict[str, object]:
        """The ``--json`` form."""
        return {
            "ref": self.ref,
            "digest": self.digest,
            "dest": str(self.dest),
            "files": self.files,
            "bytes": self.bytes,
            "tag_version": self.tag_version,
        }


def _fetch(session: Session, entry: FileEntry, root: Path, advance: Callable[[int], None]) -> int:
    target = root / entry.path
    target.parent.mkdir(parents=True, exist_ok=True)
    real_parent = target.parent.resolve()
    if real_parent != root.resolve() and root.resolve() not in real_parent.parents:
        raise UnsafePathError(f"file path {entry.path!r}: resolves outside the destination")
    got, size = session.store.fetch_blob(entry.digest, target, advance, max_size=entry.size)
    if size != entry.size or got != entry.digest:
        raise DigestMismatchError(
            f"file {entry.path!r} (blob {entry.digest}): store returned {size} bytes hashing to {got}, "
            f"expected {entry.size} bytes hashing to {entry.digest}"
        )
    return size


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False where unsupported."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    at_fdcwd = -100
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if rc != 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EINVAL):
            return False
        raise OSError(err, os.strerror(err), str(a))
    return True


def _publish(tmp: Path, dest: Path) -> None:
    if not dest.exists() and not dest.is_symlink():
        os.rename(tmp, dest)
        return
    if dest.is_symlink() or not dest.is_dir():
        raise UsageError(f"{dest}: exists and is not a folder; refusing to replace it")
    if _exchange(tmp, dest):
        shutil.rmtree(tmp)
        return
    old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(dest, old)
    os.rename(tmp, dest)
    shutil.rmtree(old)


def write_metadata(session: Session, resolved: Resolved, root: Path) -> None:
    """Record the manifest, its signatures and the resolved reference under ``root/.shardport``."""
    meta = root / METADATA_DIR
    (meta / "signatures").mkdir(parents=True)
    (meta / "manifest.json").write_bytes(resolved.raw)
    for blob in referrers(session, resolved.ref.name, resolved.digest, SIGNATURE_ARTIFACT):
        with contextlib.suppress(Exception):
            data = session.store.read_blob(blob)
            (meta / "signatures" / f"{blob.partition(':')[2]}.json").write_bytes(data)
    ref = {
        "ref": str(resolved.ref),
        "repository": resolved.ref.name,
        "digest": resolved.digest,
        "tag_version": resolved.tag_entry.doc.version if resolved.tag_entry else None,
        "signers": list(resolved.signers),
    }
    (meta / "ref.json").write_text(json.dumps(ref, indent=1, sort_keys=True) + "\n")


def pull(session: Session, ref: Ref, dest: Path, *, reporter: Reporter | None = None) -> PullResult:
    """Pull ``ref`` into folder ``dest``."""
    reporter = reporter or Quiet()
    resolved = resolve(session, ref)
    files = resolved.manifest.files
    check_paths([f.path for f in files], source=f"manifest {resolved.digest}")
    dest = dest.absolute()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.pull-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        advance = reporter.task("downloading", sum(f.size for f in files))
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            total = sum(pool.map(lambda f: _fetch(session, f, tmp, advance), files))
        manifest = resolved.manifest
        producer = load_producer(manifest, session.store.read_blob)
        if manifest.tensors and manifest.weights:  # the bytes must still mean what was signed
            check_stored(tmp, manifest.tensors, manifest.weights, producer=producer)
        write_metadata(session, resolved, tmp)
        if producer is not None:
            (tmp / METADATA_DIR / WITNESS_FILE).write_bytes(producer.to_bytes())
        _publish(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PullResult(
        ref=str(ref),
        digest=resolved.digest,
        dest=dest,
        files=len(files),
        bytes=total,
        tag_version=resolved.tag_entry.doc.version if resolved.tag_entry else None,
    )
