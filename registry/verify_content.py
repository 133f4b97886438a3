"""What ``registry verify REF`` checks on a verified local copy of a stored artifact's files.

:func:`verify_ref <shardport.registry.verify.verify_ref>` streams each blob once from the store into a
temporary folder (hashing it on the way) and then runs, on that copy, everything a pull or a rank pull
would run on the bytes it reads: the tile index against the manifest's tensor table and every tile's
BLAKE3 against the bytes, the container headers re-parsed and matched against the tensor table, and
the semantic gates and every witness re-decoded (:func:`check_weights`, the same call pull makes).

Each check returns findings ``(kind, object, message)`` instead of raising, so one run reports every
failing thing. Memory stays bounded: tiles are hashed from a memory map one tile at a time (a tile of a
narrow row-major grid is copied once, at most ``tile_target`` bytes), the gates map one weight's planes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardport import ShardportError
from shardport.registry.artifact.gguf_header import check_header_file
from shardport.registry.artifact.manifest import FileEntry, Manifest
from shardport.registry.artifact.witness_file import load_producer
from shardport.registry.checkpoint.analysis import check_stored
from shardport.registry.formats import parse_gguf, parse_safetensors
from shardport.registry.formats.notes import Notes
from shardport.registry.tiles.grid import tiles_mismatch
from shardport.registry.tiles.model import TensorTiles, TileIndex, check_tile, tile_hash

Finding = tuple[str, str, str]
"""``(kind, object, message)``: one line of a verification report."""

MAX_TILE_FINDINGS = 32
"""Tile mismatches reported one by one; beyond this one finding counts the rest."""


def table_findings(manifest: Manifest) -> list[Finding]:
    """Every tensor of the table lies inside a file the manifest lists (else pull cannot map it)."""
    sizes = {f.path: f.size for f in manifest.files}
    out: list[Finding] = []
    for e in manifest.tensors or []:
        size = sizes.get(e.file)
        if size is None:
            out.append(
                ("TensorTableMismatch", e.name, f"lies in {e.file!r}, which the manifest's files lack")
            )
        elif not e.start <= e.end <= size:
            out.append(
                (
                    "TensorTableMismatch",
                    e.name,
                    f"bytes [{e.start}, {e.end}) do not lie inside {e.file} ({size} bytes in the manifest)",
                )
            )
    return out


def index_findings(manifest: Manifest, index: TileIndex) -> tuple[list[Finding], set[str]]:
    """Whether the tile index describes exactly the manifest's tensors (as a rank pull checks each).

    Returns the findings and the names of the tensors whose tiles can be checked against the bytes.
    """
    out: list[Finding] = []
    files = {f.path: f for f in manifest.files}
    entries = {e.name: e for e in manifest.tensors or []}
    good: set[str] = set()
    for name, entry in entries.items():
        tiles = index.tensors.get(name)
        if tiles is None:
            out.append(("TileIndexMismatch", name, "tensor is in the manifest but not in the tile index"))
            continue
        problem = tiles_mismatch(entry, tiles, files)
        if problem:
            out.append(("TileIndexMismatch", name, problem))
        else:
            good.add(name)
    out += [
        ("TileIndexMismatch", name, f"tile index lists a tensor the manifest does not have (in {t.file})")
        for name, t in index.tensors.items()
        if name not in entries
    ]
    return out, good


def _tile_bytes(
    mm: npt.NDArray[np.uint8], tiles: TensorTiles
) -> Iterator[tuple[int, int, npt.NDArray[np.uint8]]]:
    """Every tile ``(i, j, bytes in hash order)`` of ``tiles`` from the file mapped as ``mm``."""
    if tiles.nbytes == 0:
        yield 0, 0, np.empty(0, dtype=np.uint8)
        return
    if tiles.layout == "tiled":
        for i in range(tiles.grid_rows):
            for j in range(tiles.grid_cols):
                r0, r1, c0, c1 = tiles.tile_rect(i, j)
                first = tiles.tile_start(i, j)
                yield i, j, mm[first : first + (r1 - r0) * (c1 - c0)]
        return
    matrix = mm[tiles.start : tiles.end].reshape(tiles.rows, tiles.row_bytes)
    for i in range(tiles.grid_rows):
        block = matrix[i * tiles.row_block : (i + 1) * tiles.row_block]
        for j in range(tiles.grid_cols):
            part = block[:, j * tiles.col_block : (j + 1) * tiles.col_block]
            yield i, j, np.ascontiguousarray(part).reshape(-1)


def tile_findings(
    root: Path, index: TileIndex, names: Iterable[str], budget: int = MAX_TILE_FINDINGS
) -> tuple[int, list[Finding]]:
    """Hash every tile of tensors ``names`` in the files under ``root``; return tiles checked, findings.

    The tensors must have passed :func:`index_findings` and their files must be under ``root`` with
    the sizes the manifest lists (so every tile lies inside its file).
    """
    out: list[Finding] = []
    checked = failed = 0
    maps: dict[str, npt.NDArray[np.uint8]] = {}
    for name in sorted(names):
        tiles = index.tensors[name]
        mm = maps.get(tiles.file)
        if mm is None:
            path = root / tiles.file
            mm = (
                np.memmap(path, dtype=np.uint8, mode="r")
                if path.stat().st_size
                else np.empty(0, dtype=np.uint8)
            )
            maps[tiles.file] = mm
        for i, j, data in _tile_bytes(mm, tiles):
            checked += 1
            try:
                check_tile(tiles, i, j, tile_hash(data.data), tensor=name)
            except ShardportError as exc:
                failed += 1
                if failed <= budget:
                    out.append(("TileDigestMismatch", f"{name} tile ({i}, {j})", str(exc)))
    if failed > budget:
        out.append(("TileDigestMismatch", "tiles", f"{failed - budget} more tiles do not match their hash"))
    return checked, out


def header_findings(root: Path, manifest: Manifest, present: set[str]) -> list[Finding]:
    """Re-parse the safetensors/GGUF headers (the push gates) and match them with the tensor table.

    Only the files ``present`` under ``root`` (their copies have the listed sizes) are read.
    """
    if manifest.container.kind not in ("safetensors", "gguf"):
        return []  # a converted (shardport-tiled) artifact: its headers are not the tensors' places
    out: list[Finding] = []
    listed: dict[str, dict[str, tuple[Any, ...]]] = {}
    for e in manifest.tensors or []:
        listed.setdefault(e.file, {})[e.name] = (e.start, e.end, e.dtype, tuple(e.shape))
    for f in manifest.files:
        if f.path not in present or not f.path.endswith((".safetensors", ".gguf")):
            continue
        try:
            if f.path.endswith(".gguf"):
                g = parse_gguf(root / f.path, notes=Notes(root=root))  # noted at push: not refused
                found = {t.name: (t.start, t.end, t.ggml_type, tuple(t.shape)) for t in g.tensors}
                out += _header_digest_findings(root, f, g.kv_end)
            else:
                s = parse_safetensors(root / f.path, notes=Notes(root=root))
                found = {t.name: (t.start, t.end, t.dtype, tuple(t.shape)) for t in s.tensors}
        except ShardportError as exc:
            out.append((type(exc).__name__, f.path, str(exc)))
            continue
        wanted = listed.get(f.path, {})
        for name in sorted(found.keys() | wanted.keys()):
            if name not in wanted:
                out.append(
                    ("HeaderMismatch", f"{f.path}:{name}", "in the file's header, not in the manifest")
                )
            elif name not in found:
                out.append(
                    ("HeaderMismatch", f"{f.path}:{name}", "in the manifest, not in the file's header")
                )
            elif found[name] != wanted[name]:
                out.append(
                    (
                        "HeaderMismatch",
                        f"{f.path}:{name}",
                        f"header has (start, end, dtype, shape) = {found[name]}, the manifest {wanted[name]}",
                    )
                )
    return out


def _header_digest_findings(root: Path, f: FileEntry, kv_end: int | None) -> list[Finding]:
    if f.gguf_header is None:
        return []
    try:
        check_header_file(root / f.path, f.gguf_header, file=f.path, kv_end=kv_end)
    except ShardportError as exc:
        return [(type(exc).__name__, f.path, str(exc))]
    return []


def gguf_header_findings(root: Path, manifest: Manifest, present: set[str]) -> list[Finding]:
    """Each GGUF file ``present`` under ``root`` against its recorded header digest (re-gated first)."""
    out: list[Finding] = []
    for f in manifest.files:
        if f.path not in present or f.gguf_header is None:
            continue
        try:
            kv_end = parse_gguf(root / f.path, notes=Notes(root=root)).kv_end
        except ShardportError as exc:
            out.append((type(exc).__name__, f.path, str(exc)))
            continue
        out += _header_digest_findings(root, f, kv_end)
    return out


def check_weights(
    root: Path, manifest: Manifest, read_witness: Callable[[str], bytes], *, source: str
) -> tuple[int, list[Finding]]:
    """Semantic gates and every witness re-decoded on the files under ``root``, as pull runs them.

    The one place ``verify`` checks witnesses: the same :func:`check_stored` call pull makes on the
    whole checkpoint (with the producer's ``push --witness`` rows, read by ``read_witness`` from its
    digest and checked against the signed one); when it fails, weight by weight again so that every
    failing weight is reported. Returns (weights checked, findings).
    """
    tensors, weights = manifest.tensors or [], manifest.weights or []
    if not tensors or not weights:
        return 0, []
    try:
        producer = load_producer(manifest, read_witness, source=source)
    except OSError as exc:
        return 0, [("MissingFile", source, f"the producer witness: {exc.strerror or exc}")]
    except ShardportError as exc:
        return 0, [(type(exc).__name__, source, str(exc))]
    try:
        return check_stored(root, tensors, weights, producer=producer), []
    except (ShardportError, ValueError, OSError):
        pass
    out: list[Finding] = []
    for w in weights:
        try:
            check_stored(root, tensors, [w], producer=producer)
        except (ShardportError, ValueError, OSError) as exc:
            out.append((type(exc).__name__, w.name, str(exc)))
    return len(weights), out
