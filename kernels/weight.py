"""The rank-local weight a kernel is given: the contract, the slice and the planes as the loader returns them.

Kernels import neither placement nor the loader, so the caller (bring-up) fills a :class:`RankWeight`
from ``load_rank`` with :func:`rank_weight`: the manifest's :class:`LogicalWeight`, the rank's planes
keyed by tensor name (GGUF blocks as raw ``uint8 [rows, bytes]``, packed int32 words, BF16 as uint16
bit patterns — exactly the loader's arrays) and the logical slice the rank owns (``{"N": (start, stop),
"K": (start, stop)}``). The builder checks every plane's shape against the contract at the local extents
and derives the *local contract*: the same numeric contract with the planes' rank-local physical shapes,
so the registry's reference decoder decodes the slice as it stands. The tiled storage layout never reaches
kernels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from shardport.registry.contracts.gates import expected_codes_shape
from shardport.registry.contracts.gguf_blocks import BLOCK_SIZES, row_bytes
from shardport.registry.contracts.model import (
    AffineIntContract,
    FloatContract,
    GgufBlockContract,
    GroupMapIndex,
    GroupMapNone,
    LogicalShape,
    LogicalWeight,
    PermutationPlane,
    PlaneRole,
    ZeroFloatPlane,
    ZeroIntPlane,
    contract_planes,
)
from shardport.registry.contracts.packing import packed_extent

from .errors import RankWeightError

AnyContract = FloatContract | AffineIntContract | GgufBlockContract
Range = tuple[int, int]
Array = npt.NDArray[Any]


@dataclass(frozen=True, slots=True, eq=False)
class RankWeight:
    """One rank's piece of a logical weight ``[N, K]``: rows ``row_start..+n_local``, columns ``col_start..``.

    ``contract``: the *local* contract (physical shapes of the rank-local planes; groups counted from the
    slice's first column); ``weight``: the manifest's logical weight (full shape, witness); ``planes``:
    role → array, exactly as loaded; ``names``: role → tensor name.
    """

    weight: LogicalWeight
    contract: AnyContract
    n_local: int
    k_local: int
    row_start: int
    col_start: int
    planes: Mapping[PlaneRole, Array]
    names: Mapping[PlaneRole, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The logical weight's name."""
        return self.weight.name

    @property
    def full_shape(self) -> tuple[int, int]:
        """``(N, K)`` of the whole weight."""
        n, k = self.weight.shape.extents
        return n, k

    @property
    def where(self) -> str:
        """The weight and its slice, for messages: ``name[N=0:128, K=256:512]``."""
        return (
            f"{self.name}[N={self.row_start}:{self.row_start + self.n_local}, "
            f"K={self.col_start}:{self.col_start + self.k_local}]"
        )

    @property
    def named_planes(self) -> dict[str, Array]:
        """The planes keyed by tensor name (what the registry's reference decoders read)."""
        return {self.names[role]: array for role, array in self.planes.items()}

    @property
    def local_weight(self) -> LogicalWeight:
        """A logical weight of the slice alone (local shape and contract, no witness)."""
        shape = LogicalShape(axes=("N", "K"), extents=(self.n_local, self.k_local))
        return self.weight.model_copy(update={"shape": shape, "contract": self.contract, "witness": None})

    @property
    def plane_bytes(self) -> int:
        """Bytes of the planes as loaded (the ledger's account of this weight on this rank)."""
        return sum(int(a.nbytes) for a in self.planes.values())

    @property
    def act_order(self) -> bool:
        """Whether columns use groups out of order (a non-sequential g_idx)."""
        group_map = getattr(self.contract, "group_map", None)
        return isinstance(group_map, GroupMapIndex) and not group_map.sequential


def _fail(where: str, what: str, expected: Any, found: Any, remedy: str | None = None) -> RankWeightError:
    return RankWeightError(where, what, expected, found, remedy)


def _axes_shape(axes: tuple[str, ...], extents: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(extents[a] for a in axes)


def _check_shape(where: str, tensor: str, array: Array | None, expected: tuple[int, ...]) -> None:
    """A loaded plane's shape against the contract's at the local extents (no plane: nothing to check)."""
    if array is not None and tuple(array.shape) != tuple(expected):
        raise _fail(
            where,
            f"plane {tensor} shape",
            list(expected),
            list(array.shape),
            "the loader's slice does not match the contract at the rank-local extents",
        )


def _local_affine(
    where: str,
    c: AffineIntContract,
    planes: Mapping[str, Array] | None,
    bounds: tuple[Range, Range],
    full: int,
) -> AffineIntContract:
    (n0, n1), (k0, k1) = bounds
    n, k = n1 - n0, k1 - k0
    scales = c.scales
    if scales.group_axis != "K":
        raise _fail(where, "scales.group_axis", "K", scales.group_axis)
    act_order = isinstance(c.group_map, GroupMapIndex) and not c.group_map.sequential
    size = scales.group_size
    if not act_order and k0 % size:
        raise _fail(
            where,
            "slice start along K",
            f"a multiple of the group size {size}",
            k0,
            "a split through a quantization group; plan with --policy align",
        )
    if not act_order and k1 != full and k % size:
        raise _fail(where, "slice length along K", f"a multiple of the group size {size}", k)
    groups = scales.group_count if act_order else -(-k // size)
    update: dict[str, Any] = {}
    codes_shape = expected_codes_shape(c.codes, n, k)
    got = (lambda plane: None) if planes is None else planes.__getitem__
    _check_shape(where, c.codes.plane, got(c.codes.plane), codes_shape)
    update["codes"] = c.codes.model_copy(update={"physical_shape": codes_shape})
    scale_shape = _axes_shape(scales.physical_axes, {"N": n, "G": groups})
    _check_shape(where, scales.plane, got(scales.plane), scale_shape)
    tail = scales.tail_rule if act_order else ("partial_last" if k % size else "exact")
    update["scales"] = scales.model_copy(
        update={"physical_shape": scale_shape, "group_count": groups, "tail_rule": tail}
    )
    zero = c.zero_point
    if isinstance(zero, ZeroIntPlane | ZeroFloatPlane):
        extents = {"N": n, "G": groups}
        if isinstance(zero, ZeroIntPlane) and zero.packing.axis != "none":
            axis = zero.packing.axis
            extents[axis] = packed_extent(extents[axis], zero.bits, zero.packing)
        zero_shape = _axes_shape(zero.physical_axes, extents)
        _check_shape(where, zero.plane, got(zero.plane), zero_shape)
        update["zero_point"] = zero.model_copy(update={"physical_shape": zero_shape})
    group_map = c.group_map
    if isinstance(group_map, GroupMapIndex):
        g_idx = got(group_map.plane)
        _check_shape(where, group_map.plane, g_idx, (k,))
        if group_map.sequential:  # without planes (admission), as declared; the load checks the values
            expected = (np.arange(k0, k1, dtype=np.int64)) // size
            if g_idx is not None and not np.array_equal(g_idx.reshape(-1).astype(np.int64), expected):
                raise _fail(where, f"{group_map.plane} values", "column // group_size (sequential)", "not")
            update["group_map"] = GroupMapNone(kind="none")
        else:
            update["group_map"] = group_map.model_copy(update={"physical_shape": (k,)})
    if isinstance(c.permutation, PermutationPlane) and (k0, k1) != (0, full):
        raise _fail(
            where,
            "slice along K",
            f"the whole K (0..{full}) for a weight with a permutation plane",
            f"{k0}..{k1}",
        )
    return c.model_copy(update=update)


def _local_contract(
    where: str, c: AnyContract, planes: Mapping[str, Array] | None, bounds: tuple[Range, Range], full_k: int
) -> AnyContract:
    (n0, n1), (k0, k1) = bounds
    if isinstance(c, AffineIntContract):
        return _local_affine(where, c, planes, bounds, full_k)
    if isinstance(c, GgufBlockContract):
        block = BLOCK_SIZES[c.ggml_type][0]
        if k0 % block or (k1 - k0) % block:
            raise _fail(where, "slice along K", f"whole {c.ggml_type} blocks of {block}", f"{k0}..{k1}")
        per_row = row_bytes(c.ggml_type, k1 - k0, c.plane)
        if planes is None:
            return c
        data = planes[c.plane]
        # blocks as raw uint8 rows; F32/F16/BF16 tensors as the loader views them (the decoder reads bytes)
        raw = data.dtype == np.uint8 or c.ggml_type in ("F32", "F16", "BF16")
        if not raw or data.nbytes != (n1 - n0) * per_row:
            raise _fail(
                where,
                f"plane {c.plane}",
                f"uint8 blocks [{n1 - n0}, {per_row}]",
                f"{data.dtype} {list(data.shape)}",
            )
        return c
    _check_shape(where, c.plane, None if planes is None else planes[c.plane], (n1 - n0, k1 - k0))
    return c


def slice_weight(weight: LogicalWeight, bounds: Mapping[str, Range] | None = None) -> RankWeight:
    """One rank's piece of ``weight`` from the manifest alone, without planes: what admission reads.

    The local contract and extents :func:`rank_weight` gives the loaded piece, less what only the bytes
    can show (the planes' shapes, a sequential ``g_idx``'s values: checked at load). The same refusals
    for a slice through a group or block, or a contract family no kernel reads.
    """
    return rank_weight(weight, None, bounds)


def rank_weight(
    weight: LogicalWeight,
    planes: Mapping[str, Array] | None,
    bounds: Mapping[str, Range] | None = None,
) -> RankWeight:
    """Describe one rank's piece of ``weight`` for the kernels.

    ``planes``: the rank's arrays keyed by tensor name (``RankTensor.tensor`` → ``RankTensor.array``;
    None: :func:`slice_weight`);
    ``bounds``: the logical slice the rank owns per axis (``LogicalSlice`` as ``dict(zip(axes,
    bounds))``), the whole weight when None or when an axis is absent. Raises :class:`RankWeightError`
    for a missing plane, a plane whose shape is not the contract's at the local extents, or a slice that
    starts inside a group or block.
    """
    if weight.shape.axes != ("N", "K"):
        raise _fail(weight.name, "logical axes", "(N, K) (a linear operator's weight)", weight.shape.axes)
    n_full, k_full = weight.shape.extents
    given = dict(bounds or {})
    n0, n1 = given.get("N", (0, n_full))
    k0, k1 = given.get("K", (0, k_full))
    where = f"{weight.name}[N={n0}:{n1}, K={k0}:{k1}]"
    if not (0 <= n0 < n1 <= n_full and 0 <= k0 < k1 <= k_full):
        raise _fail(where, "slice bounds", f"inside N=0:{n_full}, K=0:{k_full}", f"N={n0}:{n1}, K={k0}:{k1}")
    roles = contract_planes(weight.contract)
    missing = [] if planes is None else sorted(set(roles) - set(planes))
    if missing:
        raise _fail(
            where, "planes", f"{sorted(roles)}", f"missing {missing}", "load every plane of the weight"
        )
    if not isinstance(weight.contract, (FloatContract, AffineIntContract, GgufBlockContract)):
        raise _fail(
            where,
            "contract family",
            "float, affine_int or gguf_block (the families a kernel here reads)",
            weight.contract.family,
            "MXFP4/NVFP4 (mx_block) weights have a reference decoder but no kernel yet",
        )
    contract = _local_contract(where, weight.contract, planes, ((n0, n1), (k0, k1)), k_full)
    return RankWeight(
        weight=weight,
        contract=contract,
        n_local=n1 - n0,
        k_local=k1 - k0,
        row_start=n0,
        col_start=k0,
        planes={} if planes is None else {role: planes[tensor] for tensor, role in roles.items()},
        names={role: tensor for tensor, role in roles.items()},
    )
