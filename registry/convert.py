"""``registry convert REF NAME:TAG --layout tiled``: a new artifact whose tiles are contiguous.

Object stores charge per request, and a column slice of a row-major tensor is one small range per
row. The converted artifact stores each tensor in the ``shardport-tiled`` layout
(:mod:`.tiles.layout`), so a rank's tiles are a few large ranges. Files that hold tensors become
``<path>.sptiled``: the source file's bytes before its first tensor (header and metadata, kept
verbatim) followed by every tensor's tiled region; other files are copied unchanged. Tile hashes,
contracts and witnesses carry over (the bytes of every tile are the same).

The conversion is transactional and validated before anything is published: the source files are
fetched and verified, the tiled files written to a temporary folder, then reopened — every tile's hash
is recomputed from the new files and every weight's reference decode is compared bit for bit with the
source's — and only then uploaded with the new manifest (container ``shardport-tiled``, provenance
naming the source manifest), signature and tag document.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import shardport
from shardport.registry.artifact.hashing import digest_bytes, digest_file
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
from shardport.registry.checkpoint.analysis import PlaneReader, check_weight, stored_inventory
from shardport.registry.checkpoint.layers import encoding_of
from shardport.registry.contracts import LogicalWeight, TensorInfo, decode_weight
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
from shardport.registry.tiles.layout import LAYOUT, LAYOUT_VERSION, tile_offset, to_tiled
from shardport.registry.tiles.model import TensorTiles, TileIndex, tile_hash
from shardport.registry.trust.resolve import resolve
from shardport.registry.trust.tagging import DEFAULT_VALIDITY, require_signing_scope
from shardport.registry.trust.tags import format_time

SUFFIX = ".sptiled"
WORKERS = max(1, min(4, os.cpu_count() or 1))
"""Threads for hashing and decode checks (numpy and the hashes release the GIL)."""
DECODE_BUDGET = 1 << 30
"""Bytes of decodes in flight during validation (a larger weight is checked alone)."""
DECODE_BYTES_PER_ELEMENT = {"float": 16}
"""Peak bytes per logical element of checking one weight, by contract family (tracemalloc): a float
weight 14 (both float32 decodes, the de-tiled plane, the comparison), a quantized one up to ~29 (the
decoders' intermediates); families not listed count :data:`DECODE_BYTES_DEFAULT`."""
DECODE_BYTES_DEFAULT = 32


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


def _write_tiled(
    src: Path, out: Path, path: str, tensors: list[TensorEntry], index: TileIndex
) -> tuple[str, list[TensorEntry], dict[str, TensorTiles]]:
    new_path = path + SUFFIX
    data = np.memmap(src / path, dtype=np.uint8, mode="r")
    ordered = sorted(tensors, key=lambda t: t.start)
    entries, tiles = [], {}
    target = out / new_path
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as fh:
        fh.write(data[: ordered[0].start].data)  # header and metadata, verbatim
        at = ordered[0].start
        for t in ordered:
            tt = index.tensors[t.name]
            region = to_tiled(
                np.asarray(data[t.start : t.end]), tt.rows, tt.row_bytes, tt.row_block, tt.col_block
            )
            fh.write(region.data)
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
    return new_path, entries, tiles


def _write_all(
    m: Manifest, src: Path, out: Path, index: TileIndex
) -> tuple[list[TensorEntry], dict[str, TensorTiles], list[str]]:
    """Write every file of ``m`` under ``out``: tensor files tiled, the others copied."""
    by_file: dict[str, list[TensorEntry]] = {}
    for t in m.tensors or []:
        by_file.setdefault(t.file, []).append(t)
    entries: list[TensorEntry] = []
    tiles: dict[str, TensorTiles] = {}
    paths: list[str] = []
    for f in m.files:
        if f.path in by_file:
            new_path, new_entries, new_tiles = _write_tiled(src, out, f.path, by_file[f.path], index)
            entries += new_entries
            tiles.update(new_tiles)
            paths.append(new_path)
        else:
            (out / f.path).parent.mkdir(parents=True, exist_ok=True)
            (out / f.path).write_bytes((src / f.path).read_bytes())
            paths.append(f.path)
    return entries, tiles, paths


def _check_tiles(out: Path, name: str, tt: TensorTiles) -> None:
    """Every tile of tensor ``name`` in the written file must hash to its recorded hash."""
    mm = np.memmap(out / tt.file, dtype=np.uint8, mode="r")
    for i in range(tt.grid_rows):
        for j in range(tt.grid_cols):
            r0, r1, c0, c1 = tt.tile_rect(i, j)
            at = tt.start + tile_offset(tt.rows, tt.row_bytes, tt.row_block, tt.col_block, i, j)
            if tile_hash(mm[at : at + (r1 - r0) * (c1 - c0)].data) != tt.hashes[i * tt.grid_cols + j]:
                raise VerificationError(f"convert: {tt.file}: tensor {name} tile ({i}, {j}) does not verify")


def _check_weight(
    w: LogicalWeight,
    before: Callable[[], dict[str, npt.NDArray[Any]]],
    after: Callable[[], dict[str, npt.NDArray[Any]]],
    inventory: Mapping[str, TensorInfo],
) -> None:
    """The weight decodes bit for bit as in the source, and its gates and witness pass on the new bytes."""
    planes = after()
    with np.errstate(all="ignore"):
        a = decode_weight(w, before())
        b = decode_weight(w, planes)
    if a.shape != b.shape or not np.array_equal(_bits(a), _bits(b)):
        raise VerificationError(f"convert: weight {w.name} decodes differently after conversion")
    check_weight(w, planes, inventory)


def _run_bounded(pool: ThreadPoolExecutor, jobs: list[tuple[int, Callable[[], None]]], budget: int) -> None:
    """Run ``(cost, job)`` pairs on ``pool`` in order, at most ``budget`` cost in flight.

    A job costlier than ``budget`` runs alone. Raises the first failure in job order; what is still
    queued then is cancelled.
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


def _validate(
    manifest: Manifest,
    src: Path,
    out: Path,
    entries: list[TensorEntry],
    index: TileIndex,
    pool: ThreadPoolExecutor,
) -> None:
    """Reopen the written files: every tile hash and every weight's decode must match the source.

    Tensors' tile checks and weights' decode comparisons run on ``pool``; the decodes in flight stay
    within :data:`DECODE_BUDGET` bytes (estimated: :data:`DECODE_BYTES_PER_ELEMENT` per logical element
    of the weight's family, plus its planes).
    """
    by_name = {e.name: e for e in entries}
    old = {e.name: e for e in manifest.tensors or []}
    before, after = PlaneReader(src), PlaneReader(out)
    inventory = stored_inventory(entries)
    jobs: list[tuple[int, Callable[[], None]]] = [
        (0, partial(_check_tiles, out, name, tt)) for name, tt in index.tensors.items()
    ]
    for w in manifest.weights or []:
        planes = sum(by_name[p.tensor].end - by_name[p.tensor].start for p in w.planes if p.tensor in by_name)
        per_element = DECODE_BYTES_PER_ELEMENT.get(w.contract.family, DECODE_BYTES_DEFAULT)
        cost = per_element * math.prod(w.shape.extents) + planes
        jobs.append(
            (
                cost,
                partial(
                    _check_weight,
                    w,
                    partial(before.planes, w, old),
                    partial(after.planes, w, by_name),
                    inventory,
                ),
            )
        )
    _run_bounded(pool, jobs, DECODE_BUDGET)


def _bits(a: np.ndarray) -> np.ndarray:
    """``a``'s bytes as uint8 (compared bit for bit: NaNs and signed zeros included)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


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
) -> PushResult:
    """Convert ``ref`` to ``layout`` and publish it as ``name:tag``.

    ``layers``: as :func:`shardport.registry.push.push`'s — finishes the converted manifest (the CLI fills
    ``runtime`` and ``topology``); without it they are the source's.
    """
    if layout != "tiled":
        raise UsageError(f"--layout {layout!r}: the only layout is 'tiled'")
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
            entries, tiles, paths = _write_all(m, src, out, index)
            new_index = TileIndex(
                tile_target=index.tile_target, tile_minimum=index.tile_minimum, tensors=tiles
            )
            for p in paths:  # hashed beside the validation; identity taken before hashing
                digests.append((p, file_identity(out / p), pool.submit(digest_file, out / p)))
            _validate(m, src, out, entries, new_index, pool)
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
