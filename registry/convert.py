"""``registry convert REF NAME:TAG --layout tiled``: a new artifact whose tiles are contiguous.

Object stores charge per request, and a column slice of a row-major tensor is one small range per
row. The converted artifact stores each tensor in the ``shardport-tiled`` layout
(:mod:`.tiles.layout`), so a rank's tiles are a few large ranges. Files that hold tensors become
``<path>.sptiled``: the source file's bytes before its first tensor (header and metadata, kept
verbatim) followed by every tensor's tiled region; other files are copied unchanged. Tile hashes,
contracts and witnesses carry over (the bytes of every tile are the same).

The conversion streams: one tensor at a time, one slab of rows at a time (:mod:`.tiles.stream`), by
positioned reads of the source files and writes of the new ones, so it holds at most ``budget`` bytes
of tensor data (:data:`BUDGET`) plus the planes of the one weight under check, whatever the
checkpoint's size. It is transactional and validated before anything is published: the source files
are fetched and verified, the tiled files written to a temporary folder, then reopened — every tensor
compared bit for bit with the source's and every tile's hash recomputed from the new files, every
weight's gates and witness run on its planes read back through the new entries — and only then
uploaded with the new manifest (container ``shardport-tiled``, provenance naming the source manifest),
signature and tag document.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import numpy.typing as npt

import shardport
from shardport.registry.artifact.hashing import digest_bytes
from shardport.registry.artifact.manifest import (
    ContainerInfo,
    FileEntry,
    Manifest,
    PackingInfo,
    ProvenanceInfo,
    TensorEntry,
    TileIndexRef,
)
from shardport.registry.artifact.refs import Ref
from shardport.registry.checkpoint.analysis import NUMPY_DTYPES, check_weight, stored_inventory
from shardport.registry.checkpoint.layers import encoding_of
from shardport.registry.contracts import LogicalWeight, TensorInfo
from shardport.registry.errors import (
    DigestMismatchError,
    NotFoundError,
    StoreError,
    UsageError,
    VerificationError,
)
from shardport.registry.progress import Quiet, Reporter
from shardport.registry.push import LEASE_TIME, PushResult, publish, source_date, unchanged_head
from shardport.registry.session import Session
from shardport.registry.store.copies import file_identity
from shardport.registry.store.keys import blob_key
from shardport.registry.tiles.grid import plane_layout
from shardport.registry.tiles.layout import LAYOUT, LAYOUT_VERSION
from shardport.registry.tiles.model import TensorTiles, TileIndex
from shardport.registry.tiles.stream import check_tiled, copy_range, digest_path, read_tiled, write_tiled
from shardport.registry.trust.resolve import resolve
from shardport.registry.trust.tagging import DEFAULT_VALIDITY, require_signing_scope
from shardport.registry.trust.tags import format_time

SUFFIX = ".sptiled"
WORKERS = max(1, min(4, os.cpu_count() or 1))
"""Threads for hashing and checks (numpy, file reads and the hashes release the GIL)."""
BUDGET = 64 << 20
"""Default bytes of tensor data the conversion holds at once (slabs being tiled or checked, planes under
check), whatever the checkpoint's size; a weight whose check alone costs more is checked alone."""
CHECK_BYTES_PER_ELEMENT = {"float": 0.25, "gguf_block": 2.0, "affine_int": 3.0}
"""Peak bytes per logical element of a weight's gates and witness beyond its planes, by contract family
(tracemalloc, ``tests/registry/test_convert_jobs.py``: float ~0, GGUF Q4_1 0.5-0.9, GPTQ ~1.5, about
half of these); families not listed count
:data:`CHECK_BYTES_DEFAULT`."""
CHECK_BYTES_DEFAULT = 16.0


def _fetch_all(
    session: Session, manifest: Manifest, folder: Path, pool: ThreadPoolExecutor
) -> list[tuple[FileEntry, Callable[[], tuple[str, int]]]]:
    """Make ``folder/<path>`` hold every file of ``manifest``; return each file's digest check.

    A local store's blobs are linked in place (symlinks: no copy of the checkpoint) and hashed where
    they lie on ``pool``, while the conversion goes on (:func:`_check_sources` waits for them); a blob
    whose size is not the manifest's is refused at once, so nothing reads more than the manifest says.
    A remote store's are downloaded (at most the manifest's size) and hashed as they arrive. If a later
    file cannot be had, the files already linked are checked first: a damaged one is named as the cause.
    """
    checks: list[tuple[FileEntry, Callable[[], tuple[str, int]]]] = []
    root = session.store.local_root  # None: the store has no files here (S3)
    try:
        for f in manifest.files:
            target = folder / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            if root is not None:
                blob = root / blob_key(f.digest)
                try:  # no link followed, a regular file (a pipe or a link to /dev/zero is refused)
                    fd = session.store.open_local(blob_key(f.digest))
                except NotFoundError as exc:
                    raise StoreError(
                        f"file {f.path}: blob {f.digest} is missing from the store; run fsck"
                    ) from exc
                size = os.fstat(fd).st_size
                os.close(fd)
                if size != f.size:
                    raise DigestMismatchError(
                        f"file {f.path} (blob {f.digest}): the store holds {size} bytes, "
                        f"the manifest {f.size}"
                    )
                target.symlink_to(blob)
                checks.append((f, pool.submit(session.store.digest_blob, f.digest, max_size=f.size).result))
            else:
                got = session.store.fetch_blob(f.digest, target, max_size=f.size)
                checks.append((f, partial(_fetched, got)))
    except Exception:
        _check_sources(checks)
        raise
    return checks


@contextlib.contextmanager
def _work_dir(session: Session) -> Iterator[Path]:
    """A folder for the conversion's files, removed afterwards.

    On a local store it is a leased upload folder of the store (``uploads/convert-<id>/lease.json``:
    ``gc`` leaves a leased folder alone while the lease lives), so the tiled files are on the store's
    file system and are renamed into place when published instead of copied. Elsewhere: a temporary
    folder.
    """
    store = session.store
    root = store.local_root
    if root is None:
        with tempfile.TemporaryDirectory(prefix="shardport-convert-") as tmp:
            yield Path(tmp)
        return
    folder = f"uploads/convert-{uuid.uuid4().hex}"
    lease = {"expires": format_time(session.clock() + LEASE_TIME), "digests": []}
    store.put(f"{folder}/lease.json", json.dumps(lease).encode())
    try:
        yield root / folder
    finally:
        store.delete_tree(folder)


def _fetched(got: tuple[str, int]) -> tuple[str, int]:
    return got


def _check_sources(checks: list[tuple[FileEntry, Callable[[], tuple[str, int]]]]) -> None:
    """Raise :class:`DigestMismatchError` for the first source file whose bytes are not its digest's."""
    for f, result in checks:
        got, size = result()
        if (got, size) != (f.digest, f.size):
            raise DigestMismatchError(
                f"file {f.path} (blob {f.digest}): store returned bytes hashing to {got}"
            )


class _Files:
    """Read-only descriptors of the conversion's files, opened once each, closed by :meth:`close`.

    Shared by the pool's threads: they only read, by position.
    """

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}
        self._lock = threading.Lock()

    def fd(self, path: Path) -> int:
        with self._lock:
            if path not in self._fds:
                self._fds[path] = os.open(path, os.O_RDONLY)
            return self._fds[path]

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def _chunk(budget: int) -> int:
    """Bytes of one slab: the budget shared by the writer and the pool's checks (two slabs each)."""
    return max(1, budget // (2 * (WORKERS + 1)))


def _tiles_of(index: TileIndex, t: TensorEntry, size: int) -> TensorTiles:
    """Tensor ``t``'s tiles, checked against its manifest entry and its file's size before any read."""
    tt = index.tensors.get(t.name)
    if tt is None:
        raise VerificationError(f"convert: {t.file}: tensor {t.name} has no tiles in the tile index")
    if tt.file != t.file or tt.start != t.start or tt.nbytes != t.end - t.start or t.end > size:
        raise VerificationError(
            f"convert: {t.file}: tensor {t.name}: the tile index has {tt.rows} x {tt.row_bytes} bytes "
            f"at {tt.file}:{tt.start}, the manifest bytes {t.start}..{t.end} of a {size}-byte file"
        )
    return tt


def _write_tiled(
    src: Path, out: Path, path: str, tensors: list[TensorEntry], index: TileIndex, chunk: int
) -> tuple[str, list[TensorEntry], dict[str, TensorTiles]]:
    """Write ``<path>.sptiled``: the bytes before the first tensor, then each tensor tiled, in file order.

    One tensor at a time, one slab at a time (:mod:`.tiles.stream`): ``O(chunk)`` bytes in memory.
    """
    new_path = path + SUFFIX
    ordered = sorted(tensors, key=lambda t: t.start)
    entries, tiles = [], {}
    target = out / new_path
    target.parent.mkdir(parents=True, exist_ok=True)
    src_fd = os.open(src / path, os.O_RDONLY)
    try:
        dst_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            size = os.fstat(src_fd).st_size
            at = ordered[0].start
            if at > size:
                raise VerificationError(
                    f"convert: {path}: the first tensor starts at {at}, the file has {size} bytes"
                )
            copy_range(src_fd, dst_fd, 0, at, 0, chunk, f"convert: {path}: header")  # verbatim
            for t in ordered:
                tt = _tiles_of(index, t, size)
                write_tiled(src_fd, t.start, dst_fd, at, tt, chunk, f"convert: {path}: tensor {t.name}")
                n = t.end - t.start
                entries.append(
                    t.model_copy(
                        update={
                            "file": new_path,
                            "start": at,
                            "end": at + n,
                            "layout": LAYOUT,
                            "tile_rows": tt.row_block,
                            "tile_cols": tt.col_block,
                        }
                    )
                )
                tiles[t.name] = tt.model_copy(update={"file": new_path, "start": at, "layout": "tiled"})
                at += n
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)
    return new_path, entries, tiles


def _write_all(
    m: Manifest, src: Path, out: Path, index: TileIndex, chunk: int
) -> tuple[list[TensorEntry], dict[str, TensorTiles], list[str]]:
    """Write every file of ``m`` under ``out``: tensor files tiled, the others copied (streamed)."""
    by_file: dict[str, list[TensorEntry]] = {}
    for t in m.tensors or []:
        by_file.setdefault(t.file, []).append(t)
    entries: list[TensorEntry] = []
    tiles: dict[str, TensorTiles] = {}
    paths: list[str] = []
    for f in m.files:
        if f.path in by_file:
            new_path, new_entries, new_tiles = _write_tiled(src, out, f.path, by_file[f.path], index, chunk)
            entries += new_entries
            tiles.update(new_tiles)
            paths.append(new_path)
        else:
            (out / f.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / f.path, out / f.path)
            paths.append(f.path)
    return entries, tiles, paths


def _check_tensor(
    files: _Files, src: Path, out: Path, old: TensorEntry, tt: TensorTiles, chunk: int, name: str
) -> None:
    """Tensor ``name`` in the written file: the source's bytes bit for bit, every tile its recorded hash."""
    check_tiled(files.fd(src / old.file), old.start, files.fd(out / tt.file), tt.start, tt, chunk, name)


def _planes(
    files: _Files,
    out: Path,
    w: LogicalWeight,
    by_name: Mapping[str, TensorEntry],
    index: TileIndex,
    chunk: int,
) -> dict[str, npt.NDArray[Any]]:
    """Weight ``w``'s planes, read back from the written files through the new entries.

    Row-major copies; missing ones are left out (the gates report a dropped plane).
    """
    planes: dict[str, npt.NDArray[Any]] = {}
    for plane in w.planes:
        e = by_name.get(plane.tensor)
        if e is None:
            continue
        shape = plane_layout(e)
        tt = TensorTiles(
            file=e.file,
            start=e.start,
            rows=shape.rows,
            row_bytes=shape.row_bytes,
            row_block=e.tile_rows or 0,
            col_block=e.tile_cols or 0,
            hashes=index.tensors[e.name].hashes,
            layout="tiled",
        )
        raw = read_tiled(files.fd(out / e.file), e.start, tt, chunk, f"convert: {e.file}: tensor {e.name}")
        dt = NUMPY_DTYPES.get(e.dtype)
        planes[plane.tensor] = raw if dt is None else raw.view(dt).reshape(e.shape)
    return planes


def _check_weight(
    w: LogicalWeight, planes: Callable[[], dict[str, npt.NDArray[Any]]], inventory: Mapping[str, TensorInfo]
) -> None:
    """The weight's gates and witness pass on the new bytes (its planes, read back from the new files)."""
    check_weight(w, planes(), inventory)


def _run_bounded(pool: ThreadPoolExecutor, jobs: list[tuple[int, Callable[[], None]]], budget: int) -> None:
    """Run ``(cost, job)`` pairs on ``pool`` in order, at most ``budget`` cost in flight.

    A job costlier than ``budget`` runs alone. Raises the first failure in job order; what is still
    queued then is cancelled, and what is running is waited for.
    """
    pending: deque[tuple[int, Future[None]]] = deque()
    held = 0
    try:
        for cost, job in jobs:
            while pending and held + cost > budget:
                done_cost, done = pending.popleft()
                done.result()
                held -= done_cost
            pending.append((cost, pool.submit(job)))
            held += cost
        while pending:
            pending.popleft()[1].result()
    finally:
        for _, queued in pending:
            queued.cancel()
        wait([f for _, f in pending])  # those already running finish before their files are closed


def check_cost(w: LogicalWeight, planes: int) -> int:
    """Estimated peak bytes of checking weight ``w`` whose planes hold ``planes`` bytes.

    The planes read back, plus the gates' and witness's intermediates (:data:`CHECK_BYTES_PER_ELEMENT`).
    """
    per_element = CHECK_BYTES_PER_ELEMENT.get(w.contract.family, CHECK_BYTES_DEFAULT)
    return planes + math.ceil(per_element * math.prod(w.shape.extents))


def _validate(
    manifest: Manifest,
    src: Path,
    out: Path,
    entries: list[TensorEntry],
    index: TileIndex,
    pool: ThreadPoolExecutor,
    budget: int,
) -> None:
    """Reopen the written files: every tensor's bytes and tile hashes, every weight's gates and witness.

    Each tensor is compared slab by slab with the source's bytes and its tiles hashed as they are read
    (this bit-for-bit equality of every plane implies the weights decode as in the source: a decode is
    a function of the weight's record and its planes' bytes, and both are the source's). Then each
    weight's planes are read back through the new entries and its gates and witness run on them. The
    checks run on ``pool`` with at most ``budget`` bytes in flight (a weight whose check costs more,
    :func:`check_cost`, runs alone).
    """
    by_name = {e.name: e for e in entries}
    old = {e.name: e for e in manifest.tensors or []}
    inventory = stored_inventory(entries)
    chunk = _chunk(budget)
    files = _Files()
    jobs: list[tuple[int, Callable[[], None]]] = [
        (
            2 * min(tt.nbytes, max(chunk, tt.row_bytes)),
            partial(_check_tensor, files, src, out, old[name], tt, chunk, name),
        )
        for name, tt in index.tensors.items()
    ]
    for w in manifest.weights or []:
        planes = sum(by_name[p.tensor].end - by_name[p.tensor].start for p in w.planes if p.tensor in by_name)
        read = partial(_planes, files, out, w, by_name, index, chunk)
        jobs.append((check_cost(w, planes), partial(_check_weight, w, read, inventory)))
    try:
        _run_bounded(pool, jobs, budget)
    finally:
        files.close()


def _tiled_manifest(
    m: Manifest, source: str, files: list[FileEntry], entries: list[TensorEntry], index_bytes: bytes
) -> Manifest:
    """The converted artifact's manifest: ``m`` with the tiled container, files, tensors and tile index."""
    manifest = m.model_copy(
        update={
            "container": ContainerInfo(
                kind=LAYOUT, profile_version=LAYOUT_VERSION, spec_revision=str(LAYOUT_VERSION)
            ),
            "packing": PackingInfo(
                layout=LAYOUT,
                layout_version=LAYOUT_VERSION,
                encoding=",".join(sorted({encoding_of(w) for w in m.weights or ()})) or m.container.kind,
                packer="shardport.convert",
                packer_version=shardport.__version__,
            ),
            "files": files,
            "tensors": entries,
            "tile_index": TileIndexRef(digest=digest_bytes(index_bytes)),
            "provenance": ProvenanceInfo(
                source_digest=m.provenance.source_digest,
                converter="shardport.convert",
                converter_version=shardport.__version__,
                source_manifest=source,
                parent=source,
                created_at=source_date(),  # the same source gives the same digest
            ),
        }
    )
    return Manifest.model_validate(manifest.model_dump(mode="json", by_alias=True))


def convert(
    session: Session,
    ref: Ref,
    name: str,
    tag: str,
    *,
    layout: str = "tiled",
    reporter: Reporter | None = None,
    retries: int = 0,
    valid_for: timedelta = DEFAULT_VALIDITY,
    layers: Callable[[Manifest], Manifest] | None = None,
    budget: int = BUDGET,
) -> PushResult:
    """Convert ``ref`` to ``layout`` and publish it as ``name:tag``.

    ``layers``: as :func:`shardport.registry.push.push`'s — finishes the converted manifest (the CLI fills
    ``runtime`` and ``topology``); without it they are the source's. ``budget``: bytes of tensor data held
    at once (:data:`BUDGET`); the output does not depend on it.
    """
    if layout != "tiled":
        raise UsageError(f"--layout {layout!r}: the only layout is 'tiled'")
    if budget < 1:
        raise UsageError(f"convert: a memory budget of {budget} bytes; it must be at least 1")
    require_signing_scope(session, name, tag)
    source_date()  # a bad SOURCE_DATE_EPOCH fails before anything is fetched
    resolved = resolve(session, ref)
    m = resolved.manifest
    if not m.tensors or not m.weights or m.tile_index is None:
        raise UsageError(f"{ref}: no tensor inventory or tile index to convert (push it with this shardport)")
    if m.container.kind == LAYOUT:
        raise UsageError(f"{ref}: already in the {LAYOUT} layout")
    index = TileIndex.from_bytes(session.store.read_blob(m.tile_index.digest))
    with (
        _work_dir(session) as tmp,
        ThreadPoolExecutor(max_workers=WORKERS) as pool,
    ):
        src, out = Path(tmp) / "src", Path(tmp) / "out"
        sources = _fetch_all(session, m, src, pool)
        digests: list[tuple[str, tuple[int, int, int, int], Future[tuple[str, int]]]] = []
        try:
            entries, tiles, paths = _write_all(m, src, out, index, _chunk(budget))
            new_index = TileIndex(
                tile_target=index.tile_target, tile_minimum=index.tile_minimum, tensors=tiles
            )
            for p in paths:  # hashed beside the validation; identity taken before hashing
                digests.append((p, file_identity(out / p), pool.submit(digest_path, out / p, _chunk(budget))))
            _validate(m, src, out, entries, new_index, pool, budget)
        except Exception:
            for _, _, pending in digests:
                pending.cancel()
            _check_sources(sources)  # a damaged source file is the cause: name it
            raise
        _check_sources(sources)
        files: list[tuple[Path, FileEntry, tuple[int, int, int, int] | None]] = []
        for p, ident, pending in digests:
            digest, size = pending.result()
            files.append((out / p, FileEntry(path=p, size=size, digest=digest), ident))
        index_bytes = new_index.to_bytes()
        manifest = _tiled_manifest(m, resolved.digest, [f for _, f, _ in files], entries, index_bytes)
        if layers is not None:
            manifest = layers(manifest)
        return publish(
            session,
            name,
            tag,
            files,
            manifest,
            extra_blobs=[index_bytes],
            reporter=reporter or Quiet(),
            retries=retries,
            valid_for=valid_for,
            move=True,  # the tiled files are ours: a local store renames them into place, no copy
            # like push: a re-run (e.g. after a crash) whose tag already points here adds no version
            unchanged=unchanged_head(session, name, tag, manifest),
        )
