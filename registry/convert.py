"""``registry convert REF NAME:TAG --layout tiled``: a new artifact whose tiles are contiguous.

Object stores charge per request, and a column slice of a row-major tensor is one small range per
row. The converted artifact stores each tensor in the ``shardport-tiled`` layout
(:mod:`.tiled_layout`), so a rank's tiles are a few large ranges. Files that hold tensors become
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

import tempfile
from datetime import timedelta
from pathlib import Path

import numpy as np

import shardport
from shardport.registry.analysis import PlaneReader, check_stored
from shardport.registry.contracts import decode_weight
from shardport.registry.errors import DigestMismatchError, StoreError, UsageError, VerificationError
from shardport.registry.hashing import digest_bytes, digest_file
from shardport.registry.manifest import (
    ContainerInfo,
    FileEntry,
    Manifest,
    PackingInfo,
    ProvenanceInfo,
    TensorEntry,
    TileIndexRef,
)
from shardport.registry.progress import Quiet, Reporter
from shardport.registry.push import PushResult, publish
from shardport.registry.refs import Ref
from shardport.registry.resolve import resolve
from shardport.registry.session import Session
from shardport.registry.store import blob_key, file_identity
from shardport.registry.tagging import DEFAULT_VALIDITY
from shardport.registry.tags import format_time
from shardport.registry.tiled_layout import LAYOUT, LAYOUT_VERSION, tile_offset, to_tiled
from shardport.registry.tiles import TensorTiles, TileIndex, tile_hash

SUFFIX = ".sptiled"


def _fetch_all(session: Session, manifest: Manifest, folder: Path) -> None:
    """Make ``folder/<path>`` hold every file of ``manifest``, each checked against its digest.

    A local store's blobs are linked in place (symlinks, then hashed where they lie: no copy of the
    checkpoint); a remote store's are downloaded.
    """
    for f in manifest.files:
        target = folder / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if session.store.is_local:
            blob = Path(session.store.path(blob_key(f.digest)))
            if not blob.is_file():
                raise StoreError(f"file {f.path}: blob {f.digest} is missing from the store; run fsck")
            target.symlink_to(blob)
            got, size = digest_file(target)
        else:
            got, size = session.store.fetch_blob(f.digest, target, max_size=f.size)
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


def _validate(manifest: Manifest, src: Path, out: Path, entries: list[TensorEntry], index: TileIndex) -> None:
    """Reopen the written files: every tile hash and every weight's decode must match the source."""
    by_name = {e.name: e for e in entries}
    for name, tt in index.tensors.items():
        mm = np.memmap(out / tt.file, dtype=np.uint8, mode="r")
        for i in range(tt.grid_rows):
            for j in range(tt.grid_cols):
                r0, r1, c0, c1 = tt.tile_rect(i, j)
                at = tt.start + tile_offset(tt.rows, tt.row_bytes, tt.row_block, tt.col_block, i, j)
                found = tile_hash(mm[at : at + (r1 - r0) * (c1 - c0)].data)
                if found != tt.hashes[i * tt.grid_cols + j]:
                    raise VerificationError(
                        f"convert: {tt.file}: tensor {name} tile ({i}, {j}) does not verify"
                    )
    old = {e.name: e for e in manifest.tensors or []}
    before, after = PlaneReader(src), PlaneReader(out)
    for w in manifest.weights or []:
        with np.errstate(all="ignore"):
            a = decode_weight(w, before.planes(w, old))
            b = decode_weight(w, after.planes(w, by_name))
        if a.shape != b.shape or not np.array_equal(_bits(a), _bits(b)):
            raise VerificationError(f"convert: weight {w.name} decodes differently after conversion")
    check_stored(out, entries, manifest.weights or [])


def _bits(a: np.ndarray) -> np.ndarray:
    """``a``'s bytes as uint8 (compared bit for bit: NaNs and signed zeros included)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


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
) -> PushResult:
    """Convert ``ref`` to ``layout`` and publish it as ``name:tag``."""
    if layout != "tiled":
        raise UsageError(f"--layout {layout!r}: the only layout is 'tiled'")
    resolved = resolve(session, ref)
    m = resolved.manifest
    if not m.tensors or not m.weights or m.tile_index is None:
        raise UsageError(f"{ref}: no tensor inventory or tile index to convert (push it with this shardport)")
    if m.container.kind == LAYOUT:
        raise UsageError(f"{ref}: already in the {LAYOUT} layout")
    index = TileIndex.from_bytes(session.store.read_blob(m.tile_index.digest))
    with tempfile.TemporaryDirectory(prefix="shardport-convert-") as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "out"
        _fetch_all(session, m, src)
        by_file: dict[str, list[TensorEntry]] = {}
        for t in m.tensors:
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
        new_index = TileIndex(tile_target=index.tile_target, tile_minimum=index.tile_minimum, tensors=tiles)
        _validate(m, src, out, entries, new_index)
        files: list[tuple[Path, FileEntry, tuple[int, int, int, int] | None]] = []
        for p in paths:
            ident = file_identity(out / p)
            digest, size = digest_file(out / p)
            files.append((out / p, FileEntry(path=p, size=size, digest=digest), ident))
        index_bytes = new_index.to_bytes()
        manifest = m.model_copy(
            update={
                "container": ContainerInfo(kind=LAYOUT, profile_version=LAYOUT_VERSION),
                "packing": PackingInfo(
                    layout=LAYOUT,
                    layout_version=LAYOUT_VERSION,
                    encoding=m.container.kind,
                    packer="shardport.convert",
                    packer_version=shardport.__version__,
                ),
                "files": [f for _, f, _ in files],
                "tensors": entries,
                "tile_index": TileIndexRef(digest=digest_bytes(index_bytes)),
                "provenance": ProvenanceInfo(
                    source_digest=m.provenance.source_digest,
                    converter="shardport.convert",
                    converter_version=shardport.__version__,
                    source_manifest=resolved.digest,
                    parent=resolved.digest,
                    created_at=format_time(session.clock()),
                ),
            }
        )
        manifest = Manifest.model_validate(manifest.model_dump(mode="json", by_alias=True))
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
        )
