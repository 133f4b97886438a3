"""Slab-by-slab tiling (``registry.tiles.stream``) gives exactly the whole-tensor layout functions' bytes,
at any slab size, and its check names the tile whose bytes or hash differ."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardport.registry.errors import VerificationError
from shardport.registry.tiles.layout import from_tiled, to_tiled
from shardport.registry.tiles.model import TensorTiles, tile_hash
from shardport.registry.tiles.stream import check_tiled, read_tiled, slabs, write_tiled

HEAD = 13  # bytes before the tensor in both files: offsets are honoured


def _tiles(rows: int, row_bytes: int, rb: int, cb: int, data: np.ndarray, start: int = HEAD) -> TensorTiles:
    matrix = data.reshape(rows, row_bytes)
    hashes = []
    for r0 in range(0, max(rows, 1), rb):
        for c0 in range(0, max(row_bytes, 1), cb):
            hashes.append(tile_hash(np.ascontiguousarray(matrix[r0 : r0 + rb, c0 : c0 + cb]).data))
    return TensorTiles(
        file="f",
        start=start,
        rows=rows,
        row_bytes=row_bytes,
        row_block=rb,
        col_block=cb,
        hashes=tuple(hashes),
    )


def _files(tmp: Path, data: np.ndarray) -> tuple[int, int]:
    (tmp / "src").write_bytes(b"h" * HEAD + data.tobytes() + b"tail")
    src = os.open(tmp / "src", os.O_RDONLY)
    dst = os.open(tmp / "dst", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    return src, dst


shapes = st.tuples(
    st.integers(0, 9), st.integers(0, 24), st.integers(1, 9), st.integers(1, 24), st.integers(1, 200)
).filter(lambda s: s[2] <= max(s[0], 1) and s[3] <= max(s[1], 1))


@settings(max_examples=60, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_slabs_write_check_and_read_back_the_whole_tensor_layout(
    shape: tuple[int, int, int, int, int], seed: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    rows, row_bytes, rb, cb, chunk = shape
    tmp = tmp_path_factory.mktemp("slab")
    data = np.random.default_rng(seed).integers(0, 256, rows * row_bytes, dtype=np.uint8)
    tt = _tiles(rows, row_bytes, rb, cb, data)
    src, dst = _files(tmp, data)
    try:
        write_tiled(src, HEAD, dst, 5, tt, chunk, "t")
        written = (tmp / "dst").read_bytes()[5:]
        assert written == to_tiled(data, rows, row_bytes, rb, cb).tobytes()
        check_tiled(src, HEAD, dst, 5, tt, chunk, "t")
        back = read_tiled(dst, 5, tt, chunk, "t")
        assert np.array_equal(back, from_tiled(np.frombuffer(written, np.uint8), rows, row_bytes, rb, cb))
        assert np.array_equal(back, data)
    finally:
        os.close(src)
        os.close(dst)
    seen = [(i, a, k) for i, a, k in slabs(tt, chunk)]
    assert sum(k for _, _, k in seen) == rows and {i for i, _, _ in seen} == set(range(tt.grid_rows))
    assert all(k * row_bytes <= max(chunk, row_bytes) for _, _, k in seen)  # a slab is at most a chunk


@pytest.mark.parametrize("chunk", [1, 24, 1 << 20], ids=["row", "part-band", "whole-band"])
def test_check_names_the_tile_whose_bytes_differ(chunk: int, tmp_path: Path) -> None:
    rows, row_bytes, rb, cb = 8, 12, 3, 5
    data = np.arange(rows * row_bytes, dtype=np.uint8)
    tt = _tiles(rows, row_bytes, rb, cb, data)
    src, dst = _files(tmp_path, data)
    try:
        write_tiled(src, HEAD, dst, 0, tt, chunk, "t")
        tiled = bytearray((tmp_path / "dst").read_bytes())
        tiled[3 * row_bytes + 3 * 5 + 1] ^= 1  # tile (1, 1), its first row's second byte
        (tmp_path / "dst").write_bytes(bytes(tiled))
        with pytest.raises(VerificationError, match=r"tensor w tile \(1, 1\): rows 3\.\.") as info:
            check_tiled(src, HEAD, dst, 0, tt, chunk, "w")
        assert "differ from the source's" in str(info.value)
        # a source with the same damage: the bytes agree, the recorded tile hash does not
        damaged = from_tiled(np.frombuffer(bytes(tiled), np.uint8), rows, row_bytes, rb, cb)
        (tmp_path / "src2").write_bytes(b"h" * HEAD + damaged.tobytes())
        src2 = os.open(tmp_path / "src2", os.O_RDONLY)
        try:
            with pytest.raises(VerificationError, match=r"tensor w tile \(1, 1\) does not verify"):
                check_tiled(src2, HEAD, dst, 0, tt, chunk, "w")
        finally:
            os.close(src2)
    finally:
        os.close(src)
        os.close(dst)


def test_a_short_file_is_named_not_read_past(tmp_path: Path) -> None:
    data = np.arange(64, dtype=np.uint8)
    tt = _tiles(8, 8, 2, 4, data)
    src, dst = _files(tmp_path, data)
    os.close(src)
    os.truncate(tmp_path / "src", HEAD + 40)
    src = os.open(tmp_path / "src", os.O_RDONLY)
    try:
        with pytest.raises(VerificationError, match="tensor w: the file ends at byte 53, 8 bytes short"):
            write_tiled(src, HEAD, dst, 0, tt, 1 << 20, "tensor w")
    finally:
        os.close(src)
        os.close(dst)
