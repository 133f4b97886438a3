"""Errors of the placement package.

Every message shows the arithmetic that failed (extents, per-rank sizes, the unit they must be a
multiple of) and what to do about it. A topology the user asked for that cannot be realised exits with
the usage code 2; a layout placement cannot split is refused input (5, as for the contract gates); an
inventory that contradicts itself is a verification failure (1): the manifest lied.

Tree::

    ShardportError
    └── PlacementError                (1)
        ├── TopologyError             (2)  tp/ep/pp/dp not positive, pp > layers, ep > experts, …
        │   ├── SplitRefusedError     (2)  policy ``refuse``: an even split would cut a quantization
        │   │                              group, GGUF block, packed word or head
        │   └── UnsplittableError     (2)  an axis has fewer whole units than the ranks sharing it,
        │                                  even with policy ``align``
        ├── InventoryError            (1)  tensors, weights or model parameters disagree
        ├── UnsupportedSplitError     (5)  a layout placement cannot split (fused qkv, a permutation
        │                                  plane under a K split, scales grouped along N)
        ├── PieceError                (1)  a byte piece with a negative offset or non-positive length
        └── PlanFormatError           (1)  a plan document that is not one shardport wrote
"""

from __future__ import annotations

from shardport import ShardportError


class PlacementError(ShardportError):
    """Base of every placement error."""

    exit_code = 1


class TopologyError(PlacementError):
    """The requested topology cannot be realised for this model."""

    exit_code = 2


class SplitRefusedError(TopologyError):
    """Policy ``refuse``: an even split point would cut a group, block, packed word or head."""


class UnsplittableError(TopologyError):
    """An axis holds fewer whole units (groups, blocks, words, heads) than the ranks that share it."""


class InventoryError(PlacementError):
    """The manifest's tensors, weights or model parameters are inconsistent with each other."""


class UnsupportedSplitError(PlacementError):
    """A weight's layout is one placement cannot split under the requested topology."""

    exit_code = 5


class PieceError(PlacementError):
    """A byte piece that is not a valid range of a file."""


class PlanFormatError(PlacementError):
    """A plan document (``Plan.from_json``) is malformed (the pydantic error is chained)."""
