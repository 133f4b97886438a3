"""Tile index: grid choice, tile geometry, hashing, canonical JSON and its bounded parser."""

from __future__ import annotations

import base64
import json
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardport.registry.artifact.manifest import TensorEntry
from shardport.registry.errors import DigestMismatchError, SchemaVersionError
from shardport.registry.formats.gguf_gate import GGML_TYPES
from shardport.registry.formats.safetensors_gate import DTYPE_BITS
from shardport.registry.tiles.build import build_tile_index
from shardport.registry.tiles.errors import TileDigestMismatchError, TileGridError, TileIndexError
from shardport.registry.tiles.grid import alignment, choose_grid, plan_grid, plane_layout
from shardport.registry.tiles.model import (
    TensorTiles,
    TileIndex,
    tile_hash,
    tile_pieces,
    tiles_for,
    verify_tile,
)

BLOCKS = {name: (block, size) for name, block, size in GGML_TYPES.values()}
DTYPES = ["F16", "BF16", "F32", "I32", "U8", "F8_E4M3", "F4", "F6_E2M3", "Q4_1", "Q8_0", "Q4_K", "Q6_K"]


def entry(name: str, dtype: str, shape: tuple[int, ...], start: int = 0, file: str = "f") -> TensorEntry:
    n = math.prod(shape)
    if dtype in DTYPE_BITS:
        nbytes = n * DTYPE_BITS[dtype] // 8
    else:
        block, size = BLOCKS[dtype]
        nbytes = n // block * size
    return TensorEntry(name=name, file=file, start=start, end=start + nbytes, dtype=dtype, shape=shape)


def smooth() -> st.SearchStrategy[int]:
    return st.builds(
        lambda a, b, m: 2**a * 3**b * m,
        st.integers(0, 9),
        st.integers(0, 2),
        st.sampled_from([1, 1, 5, 7, 11]),
    )


@st.composite
def entries(draw: st.DrawFn) -> TensorEntry:
    dtype = draw(st.sampled_from(DTYPES))
    unit = BLOCKS[dtype][0] if dtype in BLOCKS else (4 if dtype == "F6_E2M3" else 2)
    cols = draw(smooth().filter(lambda v: v <= 4096)) * unit
    if draw(st.integers(0, 4)) == 0:
        return entry("t", dtype, (cols,), start=draw(st.integers(0, 1 << 40)))
    rows = draw(smooth().filter(lambda v: v <= 8192))
    return entry("t", dtype, (rows, cols), start=draw(st.integers(0, 1 << 40)))


def fake_tiles(e: TensorEntry, target: int = 1 << 20, minimum: int = 64 << 10) -> TensorTiles:
    layout = plane_layout(e)
    rb, cb = plan_grid(e, target=target, minimum=minimum)
    n = max(1, -(-layout.rows // rb)) * max(1, -(-layout.row_bytes // cb))
    return TensorTiles(
        file=e.file,
        start=e.start,
        rows=layout.rows,
        row_bytes=layout.row_bytes,
        row_block=rb,
        col_block=cb,
        hashes=("ab" * 32,) * n,
    )


@settings(max_examples=300, deadline=None)
@given(
    e=entries(),
    target=st.sampled_from([16 << 10, 64 << 10, 1 << 20]),
    minimum=st.sampled_from([1 << 10, 8 << 10]),
)
def test_grid_properties(e: TensorEntry, target: int, minimum: int) -> None:
    layout = plane_layout(e)
    q, rows, row_bytes = layout.quantum, layout.rows, layout.row_bytes
    choice = choose_grid(layout, target=target, minimum=minimum)
    rb, cb = choice.row_block, choice.col_block
    tiles = fake_tiles(e, target, minimum)
    # the tiles cover the matrix exactly once
    area = 0
    for i in range(tiles.grid_rows):
        for j in range(tiles.grid_cols):
            r0, r1, c0, c1 = tiles.tile_rect(i, j)
            assert (r0, c0) == (i * rb, j * cb) and r1 > r0 and c1 > c0
            area += (r1 - r0) * (c1 - c0)
    assert (
        area == layout.nbytes and (tiles.grid_rows - 1) * rb < rows and (tiles.grid_cols - 1) * cb < row_bytes
    )
    assert cb % q == 0  # no quantum is ever split
    if layout.nbytes <= minimum:
        assert (tiles.grid_rows, tiles.grid_cols) == (1, 1)
        return
    assert rb * cb >= minimum  # full tiles never fall below the minimum
    quanta = row_bytes // q
    if (rows // alignment(rows)) * (quanta // alignment(quanta)) * q >= minimum:  # no relaxation needed
        assert (choice.row_align, choice.col_align) == (alignment(rows), alignment(quanta))
        for tp in (2, 3, 4, 6, 8):
            if rows % tp == 0:
                assert all((k * rows // tp) % rb == 0 for k in range(tp)), (tp, rows, rb)
            if quanta % tp == 0:
                assert all((k * (quanta // tp) * q) % cb == 0 for k in range(tp)), (tp, quanta, cb)
    if rb * cb > target:  # only when no aligned tile lies in [minimum, target]
        rows_ok = (
            [d for d in range(1, rows + 1) if (rows // choice.row_align) % d == 0]
            if choice.row_align > 1
            else []
        )
        cols_ok = (
            [d for d in range(1, quanta + 1) if (quanta // choice.col_align) % d == 0]
            if choice.col_align > 1
            else []
        )
        if rows_ok and cols_ok:
            assert not any(minimum <= r * c * q <= target for r in rows_ok for c in cols_ok)


def test_grid_of_llama_shapes() -> None:
    assert plan_grid(entry("q", "F16", (4096, 4096))) == (512, 1024)
    assert plan_grid(entry("emb", "BF16", (128256, 4096))) == (668, 1024)  # 128256 = 24 x 5344
    assert plan_grid(entry("q4", "Q4_1", (4096, 4096))) == (512, 320)  # 16 blocks of 20 bytes per row part
    assert plan_grid(entry("down", "Q4_K", (4096, 14336))) == (512, 1008)  # 56 blocks = 8 x 7
    assert plan_grid(entry("norm", "F32", (4096,))) == (1, 16384)  # small: one tile
    rb, cb = plan_grid(
        entry("odd", "F16", (32003, 4096))
    )  # a prime row count: rows are free, last tile ragged
    assert cb == 1024 and rb * cb <= 1 << 20


def test_plane_layout_refuses_what_cannot_be_tiled() -> None:
    with pytest.raises(TileGridError, match="dtype 'X9'"):
        plane_layout(TensorEntry(name="t", file="f", start=0, end=8, dtype="X9", shape=(2,)))
    with pytest.raises(TileGridError, match="holds 10"):
        plane_layout(TensorEntry(name="t", file="f", start=0, end=10, dtype="F32", shape=(2, 2)))
    with pytest.raises(TileGridError, match="block size 32"):
        plane_layout(TensorEntry(name="t", file="f", start=0, end=20, dtype="Q4_1", shape=(1, 16)))
    with pytest.raises(TileGridError, match="quanta"):
        plane_layout(TensorEntry(name="t", file="f", start=0, end=3, dtype="F4", shape=(2, 3)))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_tiles_for_is_exactly_the_intersecting_tiles(data: st.DataObject) -> None:
    rows, row_bytes = data.draw(st.integers(1, 60)), data.draw(st.integers(1, 60))
    rb, cb = data.draw(st.integers(1, rows)), data.draw(st.integers(1, row_bytes))
    n = -(-rows // rb) * -(-row_bytes // cb)
    t = TensorTiles(
        file="f", start=7, rows=rows, row_bytes=row_bytes, row_block=rb, col_block=cb, hashes=("0" * 64,) * n
    )
    r0 = data.draw(st.integers(0, rows))
    r1 = data.draw(st.integers(r0, rows))
    c0 = data.draw(st.integers(0, row_bytes))
    c1 = data.draw(st.integers(c0, row_bytes))
    brute = [
        (i, j)
        for i in range(t.grid_rows)
        for j in range(t.grid_cols)
        if (lambda a, b, c, d: a < r1 and r0 < b and c < c1 and c0 < d)(*t.tile_rect(i, j))
        and r0 < r1
        and c0 < c1
    ]
    assert tiles_for(t, r0, r1, c0, c1) == brute
    buf = bytes(range(256)) * 20
    for i, j in brute:  # pieces, concatenated, are the tile's rows
        a, b, c, d = t.tile_rect(i, j)
        rows_bytes = b"".join(buf[7 + r * row_bytes + c : 7 + r * row_bytes + d] for r in range(a, b))
        pieces = tile_pieces(t, i, j)
        assert b"".join(buf[o : o + n] for o, n in pieces) == rows_bytes
        assert len(pieces) == (1 if d - c == row_bytes else b - a)
    with pytest.raises(TileGridError, match="outside"):
        tiles_for(t, 0, rows + 1, 0, 1)


def _reader(data: bytes):
    return lambda file, offset, length: memoryview(data)[offset : offset + length]


def test_build_verify_and_a_flipped_byte_changes_exactly_one_tile() -> None:
    import random

    rnd = random.Random(3)
    ents = [
        entry("a", "F16", (96, 200), start=16),
        entry("b", "Q4_1", (64, 256), start=16 + 96 * 400),
        entry("c", "F32", (10,), start=16 + 96 * 400 + 64 * 160),
    ]
    data = bytearray(rnd.randbytes(ents[-1].end + 8))
    index = build_tile_index(
        ents, _reader(bytes(data)), target=4096, minimum=512, chunk_bytes=5000, threads=2
    )
    assert index.tensors["a"].row_block * index.tensors["a"].col_block <= 4096
    for name, t in index.tensors.items():
        for i in range(t.grid_rows):
            for j in range(t.grid_cols):
                verify_tile(t, i, j, [data[o : o + n] for o, n in tile_pieces(t, i, j)], tensor=name)
    at = ents[1].start + 1234
    data[at] ^= 1
    flipped = build_tile_index(ents, _reader(bytes(data)), target=4096, minimum=512)
    diff = [
        (name, k)
        for name in index.tensors
        for k, (x, y) in enumerate(zip(index.tensors[name].hashes, flipped.tensors[name].hashes, strict=True))
        if x != y
    ]
    assert len(diff) == 1 and diff[0][0] == "b"
    t = index.tensors["b"]
    i, j = divmod(diff[0][1], t.grid_cols)
    with pytest.raises(TileDigestMismatchError) as caught:
        verify_tile(t, i, j, b"".join(data[o : o + n] for o, n in tile_pieces(t, i, j)), tensor="b")
    err = caught.value
    assert isinstance(err, DigestMismatchError)
    assert err.byte_range[0] <= at < err.byte_range[1] and err.tile == (i, j)
    assert all(s in str(err) for s in ("f:", "'b'", f"({i}, {j})", str(err.byte_range[0])))
    assert pickle.loads(pickle.dumps(err)).tile == (i, j)
    with pytest.raises(TileDigestMismatchError, match="a buffer of 3 bytes"):
        verify_tile(t, i, j, b"abc", tensor="b")


def test_json_round_trip_is_canonical() -> None:
    ents = [entry("w", "F16", (64, 64)), entry("z", "U8", (0,), start=8192)]
    index = build_tile_index(ents, _reader(bytes(9000)), target=2048, minimum=256)
    raw = index.to_bytes()
    assert TileIndex.from_bytes(raw) == index
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()
    assert index.tensors["z"].hashes == (tile_hash(b""),)
    assert index.digest().startswith("sha256:")


def _doc(**changes: object) -> bytes:
    t = {
        "file": "f",
        "start": 0,
        "rows": 4,
        "row_bytes": 8,
        "row_block": 2,
        "col_block": 8,
        "hashes": ["a" * 64] * 2,
    }
    doc: dict[str, object] = {
        "version": 1,
        "hash": "blake3",
        "tile_target": 1024,
        "tile_minimum": 64,
        "tensors": {"t": t},
    }
    for key, value in changes.items():
        (t if key in t else doc)[key] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("raw", "error", "match"),
    [
        (b"{", TileIndexError, "not valid JSON"),
        (b"[]", TileIndexError, "JSON object"),
        (_doc(version=3), SchemaVersionError, "version 3"),
        (_doc(version=2), TileIndexError, "field 'files'"),  # a version-1 body stating version 2
        (_doc(hash="sha256"), TileIndexError, "tile hash"),
        (_doc(hashes=["a" * 64]), TileIndexError, "1 hashes for a grid of 2 x 1"),
        (_doc(hashes=["A" * 64] * 2), TileIndexError, "hex"),
        (_doc(hashes=["a" * 63] * 2), TileIndexError, "hex"),
        (_doc(hashes=["a" * 63, "a" * 65]), TileIndexError, "hash 0 is not 64"),  # right total, wrong split
        (_doc(hashes=["a" * 64, "g" * 64]), TileIndexError, "hash 1 is not 64"),
        (_doc(start=-1), TileIndexError, "start"),
        (_doc(start=2**53 - 2), TileIndexError, "overflows"),
        (_doc(rows=True), TileIndexError, "rows"),
        (_doc(row_block=0), TileIndexError, "row_block"),
        (_doc(row_block=5), TileIndexError, "exceed"),
        (_doc(col_block="8"), TileIndexError, "col_block"),
        (_doc(extra=1), TileIndexError, "extra"),
        (_doc(tile_target=0), TileIndexError, "tile_target"),
        (b'{"tensors": {}}', SchemaVersionError, "version None"),  # both must be stated, not defaulted
        (b'{"version": 1, "tensors": {}}', TileIndexError, "tile hash None"),
        (b'{"hash": "blake3", "tensors": {}}', SchemaVersionError, "version None"),
        (b'{"version": 1, "hash": "blake3", "tensors": {"t": 1}}', TileIndexError, "field 'tensors.t'"),
    ],
)
def test_hostile_index_documents_are_refused(raw: bytes, error: type[Exception], match: str) -> None:
    assert TileIndex.from_bytes(_doc())  # the unmodified document is fine
    with pytest.raises(error, match=match):
        TileIndex.from_bytes(raw)


def _doc2(row: list[object] | None = None, **changes: object) -> bytes:
    two = base64.b64encode(bytes(range(64))).decode()
    doc: dict[str, object] = {
        "version": 2,
        "hash": "blake3",
        "tile_target": 1024,
        "tile_minimum": 64,
        "files": ["f"],
        "tensors": {"t": row if row is not None else [0, 0, 4, 8, 2, 8, "row_major", two]},
    }
    doc.update(changes)
    return json.dumps(doc).encode()


TWO = base64.b64encode(bytes(range(64))).decode()


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (_doc2([0, 0, 4, 8, 2, 8, "row_major"]), "list of 8 values"),
        (_doc2([1, 0, 4, 8, 2, 8, "row_major", TWO]), "file 1 is not an index"),
        (_doc2([True, 0, 4, 8, 2, 8, "row_major", TWO]), "file True is not an index"),
        (_doc2([0, 0, 4, 8, 2, 8, "row_major", TWO[:-4]]), "not a whole number of 32-byte digests"),
        (_doc2([0, 0, 4, 8, 2, 8, "row_major", "!" + TWO[1:]]), "not base64"),
        (_doc2([0, 0, 4, 8, 2, 8, "row_major", TWO.replace("=", "")]), "not base64"),
        (_doc2([0, 0, 4, 8, 2, 8, "row_major", ["a" * 64] * 2]), "expected a base64 string"),
        (_doc2([0, 0, 4, 8, 1, 8, "row_major", TWO]), "2 hashes for a grid of 4 x 1"),
        (_doc2([0, 2**53 - 2, 4, 8, 2, 8, "row_major", TWO]), "overflows"),
        (_doc2([0, 0, 4, 8, 2, 8, "zigzag", TWO]), "tensors.t.layout"),
        (_doc2([0, 0, 4, 8, "2", 8, "row_major", TWO]), "tensors.t.row_block"),
        (_doc2(files=[""]), "field 'files'"),
        (_doc2(files="f"), "field 'files'"),
        (_doc2(tensors=[]), "field 'tensors'"),
        (_doc2(extra=1), "field 'extra'"),
        (_doc2(tile_target=0), "field 'tile_target'"),
    ],
)
def test_hostile_version_2_documents_are_refused(raw: bytes, match: str) -> None:
    index = TileIndex.from_bytes(_doc2())  # the unmodified document is fine
    assert index.tensors["t"].hashes == (bytes(range(32)).hex(), bytes(range(32, 64)).hex())
    with pytest.raises(TileIndexError, match=match):
        TileIndex.from_bytes(raw)


def test_version_1_documents_still_read_and_are_rewritten_as_version_2() -> None:
    old = TileIndex.from_bytes(_doc())
    assert old.version == 1
    raw = old.to_bytes()
    assert json.loads(raw)["version"] == 2 and json.loads(raw)["files"] == ["f"]
    new = TileIndex.from_bytes(raw)
    assert new.tensors == old.tensors and new.version == 2
    assert len(raw) < len(_doc())  # a digest is 43 base64 characters, not 66 with quotes


def llama_inventory(
    dtype: str,
    *,
    layers: int = 32,
    hidden: int = 4096,
    kv: int = 1024,
    inter: int = 14336,
    vocab: int = 128256,
) -> list[TensorEntry]:
    out, at = [], 0

    def add(name: str, dt: str, shape: tuple[int, ...]) -> None:
        nonlocal at
        e = entry(name, dt, shape, start=at)
        out.append(e)
        at = e.end

    add("token_embd.weight", dtype, (vocab, hidden))
    for n in range(layers):
        for slot, shape in {
            "attn_q": (hidden, hidden),
            "attn_k": (kv, hidden),
            "attn_v": (kv, hidden),
            "attn_output": (hidden, hidden),
            "ffn_gate": (inter, hidden),
            "ffn_up": (inter, hidden),
            "ffn_down": (hidden, inter),
        }.items():
            add(f"blk.{n}.{slot}.weight", dtype, shape)
        add(f"blk.{n}.attn_norm.weight", "F32", (hidden,))
        add(f"blk.{n}.ffn_norm.weight", "F32", (hidden,))
    add("output_norm.weight", "F32", (hidden,))
    add("output.weight", dtype, (vocab, hidden))
    return out


@pytest.mark.parametrize("dtype", ["BF16", "Q4_1", "Q4_K"])
def test_index_is_under_half_a_percent_of_a_llama_8b_checkpoint(dtype: str) -> None:
    inventory = llama_inventory(dtype)
    index = TileIndex(tensors={e.name: fake_tiles(e) for e in inventory})
    ratio = len(index.to_bytes()) / inventory[-1].end
    print(f"{dtype}: index {len(index.to_bytes())} bytes for {inventory[-1].end} ({ratio:.4%})")
    assert ratio < 0.005
