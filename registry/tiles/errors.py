"""Errors of the tile index (:mod:`shardport.registry.tiles`).

Tree (exit codes as in :mod:`shardport.registry.errors`)::

    RegistryError
    ├── UsageError                     (2)
    │   └── TileGridError                   a tensor cannot be tiled (unknown dtype, byte count that
    │                                       disagrees with its shape) or a rectangle is out of bounds
    └── VerificationError              (1)
        ├── TileIndexError                  the tile index document is malformed or out of bounds
        └── DigestMismatchError
            └── TileDigestMismatchError     a tile's bytes do not hash to the index's hash
"""

from __future__ import annotations

from functools import partial

from shardport.registry.errors import DigestMismatchError, UsageError, VerificationError


class TileGridError(UsageError):  # type: ignore[misc, unused-ignore]
    """A tensor cannot be tiled, or a requested rectangle lies outside its tensor."""


class TileIndexError(VerificationError):  # type: ignore[misc, unused-ignore]
    """A tile index document is malformed, out of bounds or disagrees with the manifest."""


class TileDigestMismatchError(DigestMismatchError):  # type: ignore[misc, unused-ignore]
    """A tile's bytes do not hash to the hash the tile index records for it.

    Attributes name the place: ``file``, ``tensor``, ``tile`` (i, j), ``byte_range`` (first byte and
    one past the last byte of the tile in ``file``), ``expected`` and ``found`` (hex digests).
    """

    def __init__(
        self,
        *,
        file: str,
        tensor: str,
        tile: tuple[int, int],
        byte_range: tuple[int, int],
        rows: tuple[int, int],
        cols: tuple[int, int],
        expected: str,
        found: str,
    ) -> None:
        self.file = file
        self.tensor = tensor
        self.tile = tile
        self.byte_range = byte_range
        self.rows = rows
        self.cols = cols
        self.expected = expected
        self.found = found
        super().__init__(
            f"{file}: tensor {tensor!r}: tile {tile} (rows {rows[0]}..{rows[1]}, byte columns "
            f"{cols[0]}..{cols[1]}, file bytes [{byte_range[0]}, {byte_range[1]})): expected blake3 "
            f"{expected}, found {found} (the store or the file is corrupt or tampered; re-push the "
            "artifact from a good copy)"
        )

    def __reduce__(self) -> tuple[object, ...]:
        """Pickle by keywords (errors cross process boundaries in Ray)."""
        rebuild = partial(
            type(self),
            file=self.file,
            tensor=self.tensor,
            tile=self.tile,
            byte_range=self.byte_range,
            rows=self.rows,
            cols=self.cols,
            expected=self.expected,
            found=self.found,
        )
        return (rebuild, ())
