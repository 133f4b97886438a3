"""Tile index data model, tile geometry and tile verification (pure; the spec is in :mod:`.tiles`).

A tensor's bytes are stored either row-major (``layout="row_major"``: tile ``(i, j)`` is a run of
``width`` bytes per row, ``row_bytes`` apart) or in the ``shardport-tiled`` layout (``layout="tiled"``,
:mod:`.layout`: each tile one contiguous run at ``start + tile_offset(...)``). Tile hashes, and so
:func:`verify_tile`'s check, are the same in both; :func:`tile_pieces` and the byte ranges named by
:class:`TileDigestMismatchError` follow the layout.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Sequence
from typing import Annotated, Literal, TypeAlias

import rfc8785
from blake3 import blake3
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shardport.registry.artifact.hashing import digest_bytes
from shardport.registry.errors import SchemaVersionError
from shardport.registry.tiles.errors import TileDigestMismatchError, TileGridError, TileIndexError
from shardport.registry.tiles.layout import tile_offset

BytesLike: TypeAlias = bytes | bytearray | memoryview
"""What tile hashing accepts: any contiguous byte buffer."""

HASH_NAME = "blake3"
INDEX_VERSION = 2
"""The version :meth:`TileIndex.to_bytes` writes; :meth:`TileIndex.from_bytes` reads it and version 1."""
VERSIONS = (1, 2)
MEDIA_TYPE = "application/vnd.shardport.tile-index.v1+json"
V2_ROW = ("file", "start", "rows", "row_bytes", "row_block", "col_block", "layout", "hashes")
"""A version-2 tensor row: ``file`` as an index into ``files``, ``hashes`` base64 of the raw digests."""
MAX_INT = 2**53 - 1
"""Every integer in the document stays within RFC 8785's exact range."""

_HEX64 = re.compile(r"[0-9a-f]{64}")
Count = Annotated[int, Field(ge=0, le=MAX_INT, strict=True)]
Positive = Annotated[int, Field(ge=1, le=MAX_INT, strict=True)]
Layout: TypeAlias = Literal["row_major", "tiled"]
"""How a tensor's bytes lie in its file: its row-major byte matrix, or its tiles one after another."""


def _all_hex64(values: tuple[str, ...]) -> bool:
    """Whether every value is 64 lowercase hex digits.

    C-speed passes over the values joined: a regex over a large index's hashes took 1 ms, these 0.25.
    """
    joined = "".join(values)
    if not joined.isascii() or joined != joined.lower() or set(map(len, values)) - {64}:
        return False
    try:
        binascii.unhexlify(joined)
    except (binascii.Error, ValueError):
        return False
    return True


def tile_hash(data: BytesLike | Sequence[BytesLike]) -> str:
    """BLAKE3 hex digest of ``data`` (a buffer, or buffers hashed as their concatenation)."""
    if isinstance(data, bytes | bytearray | memoryview):
        return blake3(data).hexdigest()
    h = blake3()
    for part in data:
        h.update(part)
    return h.hexdigest()


class TensorTiles(BaseModel):
    """One tensor's tiles: the byte matrix, the grid, and a hash per tile in row-major tile order.

    ``layout`` says how the tensor's ``rows * row_bytes`` bytes from ``start`` are stored: ``row_major``
    (the default, the byte matrix itself) or ``tiled`` (tile after tile, see :mod:`.layout`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    file: str = Field(min_length=1)
    start: Count
    rows: Count
    row_bytes: Count
    row_block: Positive
    col_block: Positive
    hashes: tuple[str, ...]
    layout: Layout = "row_major"

    @field_validator("hashes")
    @classmethod
    def _hex(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if _all_hex64(value):
            return value
        for k, h in enumerate(value):  # name the first bad one
            if not _HEX64.fullmatch(h):
                raise ValueError(f"hash {k} is not 64 lowercase hex digits: {h[:80]!r}")
        return value

    @model_validator(mode="after")
    def _grid(self) -> TensorTiles:
        if self.start + self.rows * self.row_bytes > MAX_INT:
            raise ValueError(f"start {self.start} + {self.rows} rows x {self.row_bytes} bytes overflows")
        if self.row_block > max(self.rows, 1) or self.col_block > max(self.row_bytes, 1):
            raise ValueError(
                f"blocks {self.row_block} x {self.col_block} exceed the matrix {self.rows} x {self.row_bytes}"
            )
        if len(self.hashes) != self.grid_rows * self.grid_cols:
            raise ValueError(
                f"{len(self.hashes)} hashes for a grid of {self.grid_rows} x {self.grid_cols} tiles"
            )
        return self

    @property
    def grid_rows(self) -> int:
        """Tiles along the row axis."""
        return max(1, -(-self.rows // self.row_block))

    @property
    def grid_cols(self) -> int:
        """Tiles along the column axis."""
        return max(1, -(-self.row_bytes // self.col_block))

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor."""
        return self.rows * self.row_bytes

    @property
    def end(self) -> int:
        """One past the tensor's last byte in its file."""
        return self.start + self.nbytes

    def tile_rect(self, i: int, j: int) -> tuple[int, int, int, int]:
        """``(row0, row1, col0, col1)`` of tile ``(i, j)`` (byte columns); raises for a tile off the grid."""
        if not (0 <= i < self.grid_rows and 0 <= j < self.grid_cols):
            raise TileGridError(
                f"{self.file}: tile ({i}, {j}) is off the grid of {self.grid_rows} x {self.grid_cols} tiles"
            )
        r0, c0 = i * self.row_block, j * self.col_block
        return r0, min(r0 + self.row_block, self.rows), c0, min(c0 + self.col_block, self.row_bytes)

    def tile_start(self, i: int, j: int) -> int:
        """File offset of tile ``(i, j)``'s first byte (its first row's first byte when row-major)."""
        r0, _, c0, _ = self.tile_rect(i, j)
        if self.layout == "tiled":
            return self.start + tile_offset(self.rows, self.row_bytes, self.row_block, self.col_block, i, j)
        return self.start + r0 * self.row_bytes + c0

    def tile_range(self, i: int, j: int) -> tuple[int, int]:
        """``(first, last)``: the file bytes ``[first, last)`` spanned by tile ``(i, j)``.

        Exactly the tile's bytes when tiled (or full-width); for a narrower row-major tile the range also
        spans the other tiles' bytes between its rows.
        """
        r0, r1, c0, c1 = self.tile_rect(i, j)
        first = self.tile_start(i, j)
        if self.layout == "tiled":
            return first, first + (r1 - r0) * (c1 - c0)
        return first, self.start + max(r1 - 1, r0) * self.row_bytes + c1

    def hash_of(self, i: int, j: int) -> str:
        """The recorded hash of tile ``(i, j)``."""
        self.tile_rect(i, j)
        return self.hashes[i * self.grid_cols + j]


class TileIndex(BaseModel):
    """Tile hashes for every tensor of an artifact (a blob referenced from the manifest).

    ``version`` is the document version it was read from (new indexes: :data:`INDEX_VERSION`);
    :meth:`to_bytes` always writes the current version.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    version: Literal[1, 2] = 2
    hash: Literal["blake3"] = "blake3"
    tile_target: Positive = 1 << 20
    tile_minimum: Positive = 64 << 10
    tensors: dict[str, TensorTiles]

    def to_bytes(self) -> bytes:
        """Canonical JSON (RFC 8785) of the version-2 document (see :mod:`.tiles`)."""
        files = sorted({t.file for t in self.tensors.values()})
        number = {f: k for k, f in enumerate(files)}
        rows: dict[str, list[int | str]] = {
            name: [
                number[t.file],
                t.start,
                t.rows,
                t.row_bytes,
                t.row_block,
                t.col_block,
                t.layout,
                base64.b64encode(binascii.unhexlify("".join(t.hashes))).decode("ascii"),
            ]
            for name, t in self.tensors.items()
        }
        doc: dict[str, int | str | list[str] | dict[str, list[int | str]]] = {
            "version": INDEX_VERSION,
            "hash": self.hash,
            "tile_target": self.tile_target,
            "tile_minimum": self.tile_minimum,
            "files": files,
            "tensors": rows,
        }
        return rfc8785.dumps(doc)

    def digest(self) -> str:
        """``sha256:<hex>`` of :meth:`to_bytes` (the blob name)."""
        return digest_bytes(self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "tile index") -> TileIndex:
        """Parse and validate untrusted bytes (version 1 or 2); errors name ``source`` and the failing field.

        A valid version-1 document is parsed once; anything else is parsed again as JSON for the
        specific error (not JSON, another version, another hash) or the version-2 reading.
        """
        failure: ValidationError | None = None
        try:
            index = cls.model_validate_json(data)
            if {"version", "hash"} <= index.model_fields_set and index.version == 1:  # stated, not defaulted
                return index
        except ValidationError as exc:  # kept without its traceback: exc -> frame -> exc would be a cycle
            failure = exc.with_traceback(None)  # holding every caller's locals (a rank's tensors) until a gc
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep, a huge number
            raise TileIndexError(f"{source}: not valid JSON ({exc})") from exc
        if not isinstance(doc, dict):
            raise TileIndexError(f"{source}: expected a JSON object, found {type(doc).__name__}")
        if doc.get("version") not in VERSIONS or isinstance(doc.get("version"), bool):
            raise SchemaVersionError(
                f"{source}: tile index version {doc.get('version')!r} is not supported (this shardport "
                f"understands {', '.join(map(str, VERSIONS))}); upgrade shardport"
            )
        if doc.get("hash") != HASH_NAME:
            raise TileIndexError(f"{source}: tile hash {doc.get('hash')!r}: expected {HASH_NAME!r}")
        if doc["version"] == 2:
            return _from_v2(cls, doc, source)
        assert failure is not None  # a document stating version 1 and blake3 that validated returned
        raise _field_error(source, failure, "")


def _field_error(source: str, failure: ValidationError, prefix: str) -> TileIndexError:
    first = failure.errors()[0]
    where = ".".join([prefix, *map(str, first["loc"])] if prefix else map(str, first["loc"]))
    return TileIndexError(f"{source}: field {where!r}: {first['msg']}")


def _unpack_hashes(value: object, where: str) -> tuple[str, ...]:
    """Hex digests from the base64 of their concatenated 32-byte values."""
    if not isinstance(value, str) or not value.isascii():
        raise TileIndexError(f"{where}: hashes: expected a base64 string, found {type(value).__name__}")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TileIndexError(f"{where}: hashes: not base64 ({exc})") from exc
    if len(raw) % 32 or base64.b64encode(raw).decode("ascii") != value:
        raise TileIndexError(
            f"{where}: hashes: {len(raw)} bytes is not a whole number of 32-byte digests in canonical base64"
        )
    text = raw.hex()
    return tuple(text[k : k + 64] for k in range(0, len(text), 64))


def _from_v2(cls: type[TileIndex], doc: dict[str, object], source: str) -> TileIndex:
    """A version-2 document (rows of :data:`V2_ROW` under ``tensors``, file names in ``files``)."""
    extra = set(doc) - {"version", "hash", "tile_target", "tile_minimum", "files", "tensors"}
    if extra:
        raise TileIndexError(f"{source}: field {sorted(extra)[0]!r}: not part of a version-2 tile index")
    files, rows = doc.get("files"), doc.get("tensors")
    if not isinstance(files, list) or not all(isinstance(f, str) and f for f in files):
        raise TileIndexError(f"{source}: field 'files': expected a list of file names")
    if not isinstance(rows, dict):
        raise TileIndexError(f"{source}: field 'tensors': expected an object of tensor rows")
    tiles: dict[str, TensorTiles] = {}
    for name, row in rows.items():
        where = f"{source}: field 'tensors.{name}'"
        if not isinstance(row, list) or len(row) != len(V2_ROW):
            raise TileIndexError(f"{where}: expected a list of {len(V2_ROW)} values {list(V2_ROW)}")
        fields = dict(zip(V2_ROW, row, strict=True))
        file = fields["file"]
        if not isinstance(file, int) or isinstance(file, bool) or not 0 <= file < len(files):
            raise TileIndexError(f"{where}: file {file!r} is not an index into the {len(files)} files")
        fields["file"] = files[file]
        fields["hashes"] = _unpack_hashes(fields["hashes"], where)
        try:
            tiles[name] = TensorTiles.model_validate(fields)
        except ValidationError as exc:
            raise _field_error(source, exc, f"tensors.{name}") from exc
    body = {k: v for k, v in doc.items() if k not in ("files", "tensors")}
    try:
        return cls.model_validate({**body, "tensors": tiles})
    except ValidationError as exc:
        raise _field_error(source, exc, "") from exc


def _check_rect(tiles: TensorTiles, row0: int, row1: int, col0: int, col1: int) -> None:
    if not (0 <= row0 <= row1 <= tiles.rows and 0 <= col0 <= col1 <= tiles.row_bytes):
        raise TileGridError(
            f"{tiles.file}: rectangle rows [{row0}, {row1}) x byte columns [{col0}, {col1}) is outside the "
            f"tensor's {tiles.rows} rows x {tiles.row_bytes} bytes"
        )


def tile_span(tiles: TensorTiles, row0: int, row1: int, col0: int, col1: int) -> tuple[int, int, int, int]:
    """Tile rows ``[i0, i1)`` x tile columns ``[j0, j1)`` intersecting the rectangle (empty: i0 == i1)."""
    _check_rect(tiles, row0, row1, col0, col1)
    if row0 == row1 or col0 == col1:
        return 0, 0, 0, 0
    rb, cb = tiles.row_block, tiles.col_block
    return row0 // rb, (row1 - 1) // rb + 1, col0 // cb, (col1 - 1) // cb + 1


def tiles_for(tiles: TensorTiles, row0: int, row1: int, col0: int, col1: int) -> list[tuple[int, int]]:
    """Tiles ``(i, j)`` that intersect rows ``[row0, row1)`` x byte columns ``[col0, col1)``, row-major."""
    _check_rect(tiles, row0, row1, col0, col1)
    if row0 == row1 or col0 == col1:
        return []
    rb, cb = tiles.row_block, tiles.col_block
    return [
        (i, j)
        for i in range(row0 // rb, (row1 - 1) // rb + 1)
        for j in range(col0 // cb, (col1 - 1) // cb + 1)
    ]


def tile_pieces(tiles: TensorTiles, i: int, j: int) -> list[tuple[int, int]]:
    """``(offset, length)`` file pieces of tile ``(i, j)`` in hash order.

    One run for a tiled tensor's tile and for a full-width row-major tile; else one run per tile row.
    """
    r0, r1, c0, c1 = tiles.tile_rect(i, j)
    width, stride = c1 - c0, tiles.row_bytes
    if r1 == r0 or width == 0:
        return []
    if tiles.layout == "tiled":
        return [(tiles.tile_start(i, j), (r1 - r0) * width)]
    if width == stride:
        return [(tiles.start + r0 * stride, (r1 - r0) * stride)]
    return [(tiles.start + r * stride + c0, width) for r in range(r0, r1)]


def tile_nbytes(tiles: TensorTiles, i: int, j: int) -> int:
    """Bytes in tile ``(i, j)``."""
    r0, r1, c0, c1 = tiles.tile_rect(i, j)
    return (r1 - r0) * (c1 - c0)


def verify_tile(
    tiles: TensorTiles,
    i: int,
    j: int,
    data: BytesLike | Sequence[BytesLike],
    *,
    tensor: str = "<tensor>",
) -> None:
    """Check ``data`` (the tile's bytes, row by row, as one buffer or a sequence of buffers).

    Raises :class:`TileDigestMismatchError` naming file, ``tensor``, tile and the tile's file byte range
    (:meth:`TensorTiles.tile_range`: for a tiled tensor exactly the tile's contiguous bytes).
    """
    r0, r1, c0, c1 = tiles.tile_rect(i, j)
    size = (
        memoryview(data).nbytes
        if isinstance(data, bytes | bytearray | memoryview)
        else sum(memoryview(p).nbytes for p in data)
    )
    found = tile_hash(data) if size == (r1 - r0) * (c1 - c0) else f"(a buffer of {size} bytes)"
    check_tile(tiles, i, j, found, tensor=tensor)


def tile_hasher() -> blake3:
    """A fresh streaming hasher of the tile hash (feed a tile's rows in order, then :func:`check_tile`)."""
    return blake3()


def check_tile(tiles: TensorTiles, i: int, j: int, found: str, *, tensor: str = "<tensor>") -> None:
    """Raise :class:`TileDigestMismatchError` unless ``found`` (hex) is tile ``(i, j)``'s recorded hash.

    A tile off the grid raises :class:`TileGridError`.
    """
    r0, r1, c0, c1 = tiles.tile_rect(i, j)
    expected = tiles.hashes[i * tiles.grid_cols + j]
    if found != expected:
        first, last = tiles.tile_range(i, j)
        raise TileDigestMismatchError(
            file=tiles.file,
            tensor=tensor,
            tile=(i, j),
            byte_range=(first, last),
            rows=(r0, r1),
            cols=(c0, c1),
            expected=expected,
            found=found,
        )
