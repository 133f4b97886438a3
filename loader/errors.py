"""Errors of the loader package.

Every message names the object (tensor, file, blob, byte range) and what to do. Storage exceptions are
wrapped once, where the read is issued, with the cause chained. A tile whose bytes do not hash to the
tile index is reported with the registry's
:class:`~shardport.registry.tiles.TileDigestMismatchError` (a ``DigestMismatchError``), unchanged.

Tree::

    ShardportError
    └── LoaderError                     (1)
        ├── SliceRequestError           (2)  a requested slice names an unknown tensor or lies outside it
        ├── IndexMismatchError          (1)  the tile index disagrees with the manifest's tensors/files
        └── RangeReadError              (6)  the store failed or returned short (cause chained)
            └── BlobNotFoundError       (3)  the blob holding a file is not in the store
"""

from __future__ import annotations

from shardport import ShardportError


class LoaderError(ShardportError):
    """Base of every loader error."""

    exit_code = 1


class SliceRequestError(LoaderError):
    """A requested slice names a tensor the manifest or tile index lacks, or lies outside the tensor."""

    exit_code = 2


class IndexMismatchError(LoaderError):
    """The tile index does not describe the manifest's tensor (file, offsets or matrix shape differ)."""


class RangeReadError(LoaderError):
    """A range read failed or returned fewer bytes than asked (the storage error is chained)."""

    exit_code = 6


class BlobNotFoundError(RangeReadError):
    """The blob that holds a checkpoint file is missing from the store."""

    exit_code = 3
