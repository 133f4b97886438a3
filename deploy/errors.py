"""Errors of the deploy package.

Tree::

    ShardportError
    └── DeployError                  (1)
        ├── GraphLayoutError         (5)  a rank layout or mesh the graph cannot run (ranges that do not
        │                                 cover the vocabulary, query heads without their kv head)
        └── GraphWeightError         (5)  a rank's weights do not fit the contract and layout (a missing
                                          operator, a linear returning the wrong width)
"""

from __future__ import annotations

from shardport import ShardportError


class DeployError(ShardportError):
    """Base of every deploy error."""

    exit_code = 1


class GraphLayoutError(DeployError):
    """A rank layout or mesh the runtime graph cannot run."""

    exit_code = 5


class GraphWeightError(DeployError):
    """A rank's weights do not fit the graph contract and its layout."""

    exit_code = 5
