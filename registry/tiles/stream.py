"""A tensor moved between the row-major and the tiled layout in slabs of bounded size (``convert``).

The unit is a *slab*: ``k`` consecutive rows of one band of tiles (tile row ``i``), with ``k`` the rows
that fit in ``chunk`` bytes (at least one row). A slab's rows are one contiguous range of the row-major
tensor; in the tiled layout (:mod:`.layout`) they are one contiguous run inside each of the band's
tiles — and when the slab is the whole band, the band's tiles are one contiguous range. So a tensor of
any size is written, checked or read back with ``O(chunk)`` bytes in memory (``O(row_bytes)`` for one
row wider than ``chunk``), by positioned reads and writes (``os.preadv`` / ``os.pwrite``) of file
descriptors: no memory map, so nothing of the files stays resident in the process.

Sizes come from a tile index already parsed with bounds (:class:`.model.TensorTiles`); the caller checks
that the tensor lies inside its file before calling, and a file shorter than a read raises
:class:`VerificationError` naming where it ends.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from shardport.registry.errors import VerificationError
from shardport.registry.tiles.layout import tile_offset
from shardport.registry.tiles.model import TensorTiles, tile_hasher

U8 = npt.NDArray[np.uint8]
MAPPED = 1 << 20
"""Arrays of at least this many bytes get their own anonymous mapping (:func:`alloc`)."""


def alloc(n: int) -> U8:
    """An uninitialised uint8 array of ``n`` bytes.

    From :data:`MAPPED` bytes up it is its own anonymous mapping, unmapped when the array is freed: the
    C allocator would serve slabs of a few MiB from its per-thread heaps (its mmap threshold rises to the
    largest block freed) and keep freed ones resident, so a conversion's resident size would creep up
    with the checkpoint's size instead of staying at its working set.
    """
    if n < MAPPED:
        return np.empty(n, dtype=np.uint8)
    return np.frombuffer(mmap.mmap(-1, n), dtype=np.uint8)


def read_exact(fd: int, offset: int, n: int, what: str) -> U8:
    """``n`` bytes of ``fd`` from ``offset`` (a new array); a file that ends first raises."""
    buf = alloc(n)
    view = buf.data
    got = 0
    while got < n:
        k = os.preadv(fd, [view[got:]], offset + got)
        if k == 0:
            raise VerificationError(f"{what}: the file ends at byte {offset + got}, {n - got} bytes short")
        got += k
    return buf


def write_exact(fd: int, offset: int, data: U8) -> None:
    """Write all of ``data`` (contiguous) at ``offset``."""
    view = np.ascontiguousarray(data).reshape(-1).data
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def copy_range(src: int, dst: int, start: int, n: int, at: int, chunk: int, what: str) -> None:
    """Copy ``src[start:start+n]`` to ``dst[at:at+n]``, ``chunk`` bytes at a time."""
    for k in range(0, n, chunk):
        write_exact(dst, at + k, read_exact(src, start + k, min(chunk, n - k), what))


def slabs(tt: TensorTiles, chunk: int) -> Iterator[tuple[int, int, int]]:
    """``(i, a, k)``: band ``i``, its rows ``[a, a + k)``; every band, even an empty one, once at least."""
    per = max(1, chunk // max(1, tt.row_bytes))
    for i in range(tt.grid_rows):
        rows_i = min(tt.row_block, tt.rows - i * tt.row_block)
        yield from ((i, a, min(per, rows_i - a)) for a in range(0, max(rows_i, 1), per))


def _columns(tt: TensorTiles) -> list[tuple[int, int]]:
    return [(c0, min(c0 + tt.col_block, tt.row_bytes)) for c0 in range(0, max(tt.row_bytes, 1), tt.col_block)]


def _band_rows(tt: TensorTiles, i: int) -> int:
    return max(0, min(tt.row_block, tt.rows - i * tt.row_block))


def _tile_at(tt: TensorTiles, i: int, j: int, a: int, width: int) -> int:
    """Offset, from the tiled region's start, of row ``a`` of tile ``(i, j)`` (``width`` bytes a row)."""
    return tile_offset(tt.rows, tt.row_bytes, tt.row_block, tt.col_block, i, j) + a * width


def write_tiled(
    src: int, src_start: int, dst: int, dst_start: int, tt: TensorTiles, chunk: int, what: str
) -> None:
    """Write the row-major tensor at ``src[src_start:]`` in the tiled layout at ``dst[dst_start:]``."""
    cols = _columns(tt)
    for i, a, k in slabs(tt, chunk):
        if k <= 0:
            continue
        r = i * tt.row_block + a
        rows = read_exact(src, src_start + r * tt.row_bytes, k * tt.row_bytes, what).reshape(k, tt.row_bytes)
        if k == _band_rows(tt, i):  # the whole band: its tiles are one contiguous range
            band = alloc(k * tt.row_bytes)
            at = 0
            for c0, c1 in cols:
                band[at : at + k * (c1 - c0)].reshape(k, c1 - c0)[...] = rows[:, c0:c1]
                at += k * (c1 - c0)
            write_exact(dst, dst_start + _tile_at(tt, i, 0, 0, 0), band)
            continue
        for j, (c0, c1) in enumerate(cols):
            write_exact(dst, dst_start + _tile_at(tt, i, j, a, c1 - c0), rows[:, c0:c1])


def _tiled_pieces(dst: int, dst_start: int, tt: TensorTiles, i: int, a: int, k: int, what: str) -> list[U8]:
    """The rows ``[a, a + k)`` of band ``i``'s tiles, read from the tiled region, one array per tile."""
    cols = _columns(tt)
    if k == _band_rows(tt, i):
        band = read_exact(dst, dst_start + _tile_at(tt, i, 0, 0, 0), k * tt.row_bytes, what)
        out, at = [], 0
        for c0, c1 in cols:
            out.append(band[at : at + k * (c1 - c0)].reshape(k, c1 - c0))
            at += k * (c1 - c0)
        return out
    return [
        read_exact(dst, dst_start + _tile_at(tt, i, j, a, c1 - c0), k * (c1 - c0), what).reshape(k, c1 - c0)
        for j, (c0, c1) in enumerate(cols)
    ]


def check_tiled(
    src: int, src_start: int, dst: int, dst_start: int, tt: TensorTiles, chunk: int, name: str
) -> None:
    """Check the tiled region at ``dst[dst_start:]`` against the row-major tensor at ``src[src_start:]``.

    Its bytes must be the source's bit for bit and every tile must hash to ``tt``'s recorded hash; raises
    :class:`VerificationError` naming the tensor and the first tile that differs.
    """
    cols = _columns(tt)
    where = f"convert: {tt.file}: tensor {name}"
    hashers = [tile_hasher() for _ in cols]
    for i, a, k in slabs(tt, chunk):
        if k > 0:
            r = i * tt.row_block + a
            rows = read_exact(src, src_start + r * tt.row_bytes, k * tt.row_bytes, where)
            rows = rows.reshape(k, tt.row_bytes)
            for j, piece in enumerate(_tiled_pieces(dst, dst_start, tt, i, a, k, where)):
                c0, c1 = cols[j]
                if not np.array_equal(piece, rows[:, c0:c1]):
                    raise VerificationError(
                        f"{where} tile ({i}, {j}): rows {r}..{r + k - 1} differ from the source's"
                    )
                hashers[j].update(piece.reshape(-1).data)
        if a + k >= _band_rows(tt, i):  # the band's last slab: its tiles are complete
            for j, h in enumerate(hashers):
                if h.hexdigest() != tt.hashes[i * tt.grid_cols + j]:
                    raise VerificationError(f"{where} tile ({i}, {j}) does not verify")
            hashers = [tile_hasher() for _ in cols]


def read_tiled(dst: int, dst_start: int, tt: TensorTiles, chunk: int, what: str) -> U8:
    """The row-major bytes of the tiled tensor at ``dst[dst_start:]`` (one new array, plus a slab)."""
    out = alloc(tt.rows * tt.row_bytes).reshape(tt.rows, tt.row_bytes)
    cols = _columns(tt)
    for i, a, k in slabs(tt, chunk):
        if k > 0:
            r = i * tt.row_block + a
            for (c0, c1), piece in zip(cols, _tiled_pieces(dst, dst_start, tt, i, a, k, what), strict=True):
                out[r : r + k, c0:c1] = piece
    return out.reshape(-1)


def digest_path(path: os.PathLike[str] | str, chunk: int) -> tuple[str, int]:
    """``sha256:<hex>`` digest and size of the file at ``path``, read ``chunk`` bytes at a time.

    One buffer for the whole file; the same value as :func:`shardport.registry.artifact.hashing.digest_file`.
    """
    h = hashlib.sha256()
    buf = alloc(max(1, chunk))
    view = buf.data
    size = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while k := os.preadv(fd, [view], size):
            h.update(view[:k])
            size += k
    finally:
        os.close(fd)
    return "sha256:" + h.hexdigest(), size
