"""Permutation planes: read one, check it is a bijection of K, and put decoded columns in logical order.

A permutation plane is attached by declaration with its direction stated (:class:`.model.PermutationPlane`):
``logical_to_stored`` (``perm[k]`` is the stored column of logical column ``k``) or ``stored_to_logical``
(``perm[s]`` is the logical column held at stored position ``s`` — act-order GPTQ's ``argsort(g_idx)``).
The reference decoders decode in stored order, then call :func:`to_logical`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from .errors import PermutationError, PlaneMissingError
from .formats import as_plane
from .model import PermutationPlane

Planes = Mapping[str, npt.NDArray[np.generic]]
I64 = npt.NDArray[np.int64]
T = TypeVar("T", bound=np.generic)


def read_permutation(weight: str, perm: PermutationPlane, planes: Planes, k: int) -> I64:
    """The plane's values as int64, after checking they are a bijection of ``range(k)``.

    Raises :class:`PermutationError` naming a repeated or out-of-range value (the plane would drop one
    logical column and duplicate another).
    """
    if perm.plane not in planes:
        raise PlaneMissingError(
            weight, f"plane {perm.plane}", "present", "absent", "the checkpoint lost its permutation plane"
        )
    order = as_plane(planes[perm.plane], perm.physical_dtype, perm.physical_shape, perm.plane)
    values = order.reshape(-1).astype(np.int64)
    if values.size != k or not np.array_equal(np.sort(values), np.arange(k, dtype=np.int64)):
        outside = values[(values < 0) | (values >= k)]
        unique, counts = np.unique(values, return_counts=True)
        repeated = unique[counts > 1]
        detail = (
            f"value {int(outside[0])} outside [0, {k})"
            if outside.size
            else f"value {int(repeated[0])} repeated ({len(unique)} distinct of {values.size})"
            if repeated.size
            else f"{values.size} values"
        )
        raise PermutationError(
            weight,
            f"{perm.plane} values ({perm.direction})",
            f"a bijection of range({k})",
            detail,
            "a permutation plane must name every column once; re-export it or drop the declaration",
        )
    return values


def to_logical(values: npt.NDArray[T], order: I64, direction: str) -> npt.NDArray[T]:
    """Reorder decoded ``[rows, K]`` columns from stored to logical order."""
    if direction == "logical_to_stored":
        return values[:, order]
    out = np.empty_like(values)
    out[:, order] = values
    return out
