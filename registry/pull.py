"""Pull an artifact into a folder.

Verify first, download and hash-check into a temporary folder beside DEST, then publish it at DEST
in one rename. DEST must be new, empty or an earlier pull (``force`` replaces any other folder; see
:mod:`~shardport.registry.output.destination`). A failed, interrupted or stopped pull leaves DEST as it was
and removes its temporary folder; the next pull removes those a killed pull left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from shardport.registry import _failpoints
from shardport.registry.artifact.digests import Digest
from shardport.registry.artifact.manifest import FileEntry
from shardport.registry.artifact.paths import check_paths
from shardport.registry.artifact.refs import Ref
from shardport.registry.artifact.witness_file import FOLDER_NAME as WITNESS_FILE
from shardport.registry.artifact.witness_file import load_producer
from shardport.registry.checkpoint.analysis import check_stored
from shardport.registry.checkpoint.describe import METADATA_DIR
from shardport.registry.errors import DigestMismatchError, UnsafePathError, UsageError
from shardport.registry.output.destination import full_pull_destination
from shardport.registry.output.staging import (
    block_stopping_signals,
    remove_stale,
    stop_on_signals,
    temp_name,
)
from shardport.registry.output.writers import RENAME_EXCHANGE, RENAME_NOREPLACE, renameat2
from shardport.registry.progress import Quiet, Reporter
from shardport.registry.session import Session
from shardport.registry.trust.resolve import Resolved, resolve
from shardport.registry.trust.signatures import SIGNATURE_ARTIFACT, referrers

WORKERS = 4


@dataclass(frozen=True)
class PullResult:
    """What a pull did."""

    ref: str
    digest: Digest
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


def _publish(tmp: Path, dest: Path, *, given: Path, store_root: Path | None, force: bool) -> None:
    """Put the verified folder ``tmp`` at ``dest``, checking the DEST rules again first."""
    full_pull_destination(given, store_root=store_root, force=force)  # DEST may have changed meanwhile
    try:
        if renameat2(tmp, dest, RENAME_NOREPLACE):
            return
    except FileExistsError:
        pass  # DEST appeared while we downloaded: the rules above decided it may be replaced
    except OSError as exc:
        raise UsageError(f"{given}: cannot publish the pulled folder there ({exc.strerror})") from exc
    try:
        if not dest.exists():
            os.rename(tmp, dest)
            return
        if renameat2(tmp, dest, RENAME_EXCHANGE):
            shutil.rmtree(tmp)  # what DEST held before, now under the temporary name
            return
        old = dest.with_name(temp_name(dest.name, "pull"))
        os.rename(dest, old)
        os.rename(tmp, dest)
        shutil.rmtree(old)
    except OSError as exc:
        raise UsageError(f"{given}: cannot replace it with the pulled folder ({exc.strerror})") from exc


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


def _fetch_all(session: Session, files: list[FileEntry], tmp: Path, advance: Callable[[int], None]) -> int:
    """Download every file into ``tmp``; on any failure or signal, stop the workers before returning.

    A signal can interrupt the pool while it starts a thread, leaving a worker the pool does not know
    of; so each download registers itself, and none starts once ``stop`` is set: when this returns or
    raises, no worker writes into ``tmp`` any more.
    """
    stop = threading.Event()
    state = threading.Condition()
    active = [0]

    def step(n: int) -> None:
        if stop.is_set():
            raise _Stopped
        advance(n)

    def fetch(entry: FileEntry) -> int:
        with state:
            if stop.is_set():
                raise _Stopped
            active[0] += 1
        try:
            return _fetch(session, entry, tmp, step)
        finally:
            with state:
                active[0] -= 1
                state.notify_all()

    pool = ThreadPoolExecutor(max_workers=WORKERS, initializer=block_stopping_signals)
    try:
        total = 0
        for n in pool.map(fetch, files):
            total += n
            _failpoints.hit("pull-file-fetched")
        return total
    finally:
        with state:
            stop.set()  # a running download stops at its next chunk; no new one starts
        pool.shutdown(wait=True, cancel_futures=True)
        with state:
            state.wait_for(lambda: active[0] == 0)


class _Stopped(Exception):
    """Raised inside a download worker once the pull has failed or was stopped."""


def pull(
    session: Session,
    ref: Ref,
    dest: Path,
    *,
    reporter: Reporter | None = None,
    force: bool = False,
) -> PullResult:
    """Pull ``ref`` into folder ``dest``.

    ``dest`` must not exist, be empty, or be an earlier pull holding only what it pulled; ``force``
    lets it replace any other folder (never the root, the home or current folder or one containing
    them, the store, a link or a file): see :mod:`~shardport.registry.output.destination`. Checked before
    anything is downloaded and again before the pulled folder replaces ``dest``. A failed, interrupted
    (SIGINT) or stopped (SIGTERM, SIGHUP) pull removes its temporary folder and leaves ``dest`` as it
    was; the next pull beside ``dest`` removes temporary folders of pulls whose process died.
    """
    reporter = reporter or Quiet()
    store_root = session.store.local_root
    where = full_pull_destination(dest, store_root=store_root, force=force)
    with stop_on_signals():
        resolved = resolve(session, ref)
        files = resolved.manifest.files
        check_paths([f.path for f in files], source=f"manifest {resolved.digest}")
        where.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(where.parent, "pull")
        tmp = where.parent / temp_name(where.name, "pull")
        try:
            tmp.mkdir()  # inside the try: a signal right after it still removes it
            total = _fetch_all(session, files, tmp, reporter.task("downloading", sum(f.size for f in files)))
            manifest = resolved.manifest
            producer = load_producer(manifest, session.store.read_blob)
            if manifest.tensors and manifest.weights:  # the bytes must still mean what was signed
                check_stored(tmp, manifest.tensors, manifest.weights, producer=producer)
            write_metadata(session, resolved, tmp)
            if producer is not None:
                (tmp / METADATA_DIR / WITNESS_FILE).write_bytes(producer.to_bytes())
            _publish(tmp, where, given=dest, store_root=store_root, force=force)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return PullResult(
        ref=str(ref),
        digest=resolved.digest,
        dest=where,
        files=len(files),
        bytes=total,
        tag_version=resolved.tag_entry.doc.version if resolved.tag_entry else None,
    )
