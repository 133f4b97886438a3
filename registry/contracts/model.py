"""The numeric contract of a logical weight, as frozen pydantic models (DESIGN.md "Numeric contract").

Vocabulary: a logical weight has the logical shape ``[N, K]`` (N = out, K = in; ``[N]`` for vectors,
``[E, N, K]`` for stacked experts). Its planes are tensors with a role (codes, scale, zero, g_idx, perm,
float, shape). Physical axes name what each dimension of a plane runs over: ``N``, ``K`` or ``G`` (the
group index along K). Nothing here is defaulted: every field is stated by whoever builds the contract.

Models validate their own structure (lengths, permutations, encodings); whether a contract fits the
planes of a checkpoint is decided by :mod:`.gates`.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .encodings import INT_DTYPES, encoding_bits

Axis = Literal["N", "K", "G"]
LogicalAxis = Literal["E", "N", "K"]
ScaleFormat = Literal["binary32", "binary16", "bfloat16", "e8m0", "e4m3"]
FloatFormat = Literal["binary32", "binary16", "bfloat16", "e4m3", "e5m2"]
PlaneRole = Literal["codes", "scale", "zero", "g_idx", "perm", "float", "shape", "global_scale"]
GgmlType = Literal[
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
    "Q2_K", "Q3_K", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "IQ4_NL", "IQ4_XS",
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
]  # fmt: skip
"""Every ggml type ``gguf.quants`` dequantizes (its reference decoders: :mod:`.gguf_blocks`)."""
#: Closed set of decode laws, each with a fixed evaluation order (see :mod:`.decode`).
DecodeLaw = Literal[
    "float_upcast", "affine_f32", "affine_round_to_scale_format", "ggml_block", "mx_f32", "mx_round_bf16"
]
#: Named placements of a scale plane's elements; see :class:`ScaleSpec`.
ScalePlacement = Literal["row_major"]
SCALE_PLACEMENTS: tuple[str, ...] = get_args(ScalePlacement)
Family = Literal["float", "affine_int", "gguf_block", "mx_block", "codebook", "mixed"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Packing(_Frozen):
    """How fields of ``bits`` width sit in the containers of a plane.

    ``scheme="slots"``: each container holds ``container_bits // bits`` whole fields; slot ``i``
    (bits ``[i*bits, (i+1)*bits)`` counted from the LSB, or from the MSB with ``msb_first``) holds the
    run element ``slot_order[i]`` — AWQ is ``(0, 2, 4, 6, 1, 3, 5, 7)``, GPTQ ``(0, 1, …, 7)``.
    ``scheme="bitstream"``: element ``e`` starts at bit ``e*bits`` of the little-endian container
    sequence and may straddle two containers (compressed-tensors); ``slot_order`` is empty.
    ``axis="none"``: one value per container (the container's integer value); ``slot_order=(0,)``.
    ``tail``: ``exact`` — the fields fill the last container; ``zero_fill`` — unused bits are zero.
    """

    axis: Literal["N", "K", "none"]
    container_bits: Literal[8, 16, 32]
    scheme: Literal["slots", "bitstream"]
    slot_order: tuple[int, ...]
    bit_order: Literal["lsb_first", "msb_first"]
    tail: Literal["exact", "zero_fill"]


def _check_packed_plane(
    physical_dtype: str, shape: tuple[int, ...], axes: tuple[str, ...], bits: int, packing: Packing
) -> None:
    if len(shape) != len(axes) or len(set(axes)) != len(axes):
        raise ValueError(f"physical_axes {axes} must name each of the {len(shape)} dimensions once")
    if physical_dtype not in INT_DTYPES:
        raise ValueError(f"packed planes are integer planes, not {physical_dtype}")
    if int(physical_dtype[1:]) != packing.container_bits:  # I32 / U8 ...: the width in the name
        raise ValueError(f"container_bits {packing.container_bits} != width of {physical_dtype}")
    if packing.axis == "none":
        if packing.scheme != "slots" or packing.slot_order != (0,):
            raise ValueError("unpacked planes (axis none) use scheme slots and slot_order (0,)")
        return
    if packing.axis not in axes:
        raise ValueError(f"pack axis {packing.axis} is not one of the physical axes {axes}")
    if packing.scheme == "bitstream":
        if packing.slot_order or packing.bit_order != "lsb_first":
            raise ValueError("bitstream packing has no slot order and is lsb_first")
        return
    if packing.container_bits % bits:
        raise ValueError(f"{bits}-bit fields do not tile a {packing.container_bits}-bit container")
    per = packing.container_bits // bits
    if sorted(packing.slot_order) != list(range(per)):
        raise ValueError(f"slot_order {packing.slot_order} is not a permutation of range({per})")


class CodesSpec(_Frozen):
    """The codes plane: its physical form, element bits and value encoding, and its packing."""

    plane: str
    physical_dtype: str
    physical_shape: tuple[int, ...]
    physical_axes: tuple[Axis, ...]
    bits: int = Field(ge=1, le=8)
    encoding: str
    packing: Packing

    @model_validator(mode="after")
    def _structure(self) -> CodesSpec:
        if encoding_bits(self.encoding) != self.bits:
            raise ValueError(f"encoding {self.encoding} is not {self.bits}-bit")
        if sorted(self.physical_axes) != ["K", "N"]:
            raise ValueError(f"codes physical_axes {self.physical_axes} must be a permutation of (N, K)")
        _check_packed_plane(
            self.physical_dtype, self.physical_shape, self.physical_axes, self.bits, self.packing
        )
        return self


class ScaleSpec(_Frozen):
    """The scale plane: format, storage, sign domain and grouping (one level, groups along K).

    ``placement`` names how the plane's elements sit in its bytes: ``row_major`` — C order over
    ``physical_axes``, so a transposed (G-major) plane is ``physical_axes=("G", "N")``. Other layouts
    (e.g. a 128x4 swizzle) are refused by name at declaration (:data:`SCALE_PLACEMENTS`).
    """

    plane: str
    physical_dtype: str
    physical_shape: tuple[int, ...]
    physical_axes: tuple[Axis, ...]
    format: ScaleFormat
    storage: Literal["numeric", "raw_bits"]
    sign: Literal["positive", "signed"]
    group_axis: Literal["K", "N"]
    group_size: int = Field(ge=1)
    group_count: int = Field(ge=1)
    tail_rule: Literal["exact", "partial_last"]
    placement: ScalePlacement
    levels: Literal[1, 2]

    @model_validator(mode="after")
    def _structure(self) -> ScaleSpec:
        if len(self.physical_shape) != len(self.physical_axes) or sorted(self.physical_axes) != ["G", "N"]:
            raise ValueError(f"scale physical_axes {self.physical_axes} must be a permutation of (N, G)")
        return self


class ZeroNone(_Frozen):
    """No zero point: the value is ``s·q``."""

    kind: Literal["none"]


class ZeroImplicit(_Frozen):
    """A constant zero point that is not stored."""

    kind: Literal["implicit"]
    value: int


class ZeroIntPlane(_Frozen):
    """An integer zero-point plane; ``minus_one`` means the stored number is zero-1 (GPTQ v1)."""

    kind: Literal["int_plane"]
    plane: str
    physical_dtype: str
    physical_shape: tuple[int, ...]
    physical_axes: tuple[Axis, ...]
    bits: int = Field(ge=1, le=8)
    encoding: str
    packing: Packing
    convention: Literal["as_is", "minus_one"]

    @model_validator(mode="after")
    def _structure(self) -> ZeroIntPlane:
        if self.encoding == "e2m1":
            raise ValueError("zero points are integers; e2m1 is a float element")
        if encoding_bits(self.encoding) != self.bits:
            raise ValueError(f"encoding {self.encoding} is not {self.bits}-bit")
        if sorted(self.physical_axes) != ["G", "N"]:
            raise ValueError(f"zero physical_axes {self.physical_axes} must be a permutation of (N, G)")
        _check_packed_plane(
            self.physical_dtype, self.physical_shape, self.physical_axes, self.bits, self.packing
        )
        return self


class ZeroFloatPlane(_Frozen):
    """A float zero-point plane in code units: the value is ``s·(q - z)``."""

    kind: Literal["float_plane"]
    plane: str
    physical_dtype: str
    physical_shape: tuple[int, ...]
    physical_axes: tuple[Axis, ...]
    format: FloatFormat
    law: Literal["code_minus_zero"]


ZeroPoint = Annotated[ZeroNone | ZeroImplicit | ZeroIntPlane | ZeroFloatPlane, Field(discriminator="kind")]


class GroupMapNone(_Frozen):
    """Column ``k`` belongs to group ``k // G``."""

    kind: Literal["none"]


class GroupMapIndex(_Frozen):
    """A g_idx plane ``[K]`` gives each column's group; ``sequential`` asserts it equals ``k // G``."""

    kind: Literal["g_idx"]
    plane: str
    physical_dtype: str
    physical_shape: tuple[int, ...]
    sequential: bool


GroupMap = Annotated[GroupMapNone | GroupMapIndex, Field(discriminator="kind")]


class PermutationNone(_Frozen):
    """Stored columns are logical columns."""

    kind: Literal["none"]


class PermutationPlane(_Frozen):
    """A permutation of the K columns, stated with its direction; the plane must be a bijection of K.

    ``direction``: ``logical_to_stored`` — logical column ``k`` is stored column ``perm[k]``;
    ``stored_to_logical`` — stored column ``s`` holds logical column ``perm[s]`` (act-order GPTQ's
    ``argsort(g_idx)`` order). Codes, scales and the group map are read in stored order.
    """

    kind: Literal["plane"]
    plane: str
    physical_dtype: str
    physical_shape: tuple[int, ...]
    axis: Literal["K"]
    direction: Literal["logical_to_stored", "stored_to_logical"]


Permutation = Annotated[PermutationNone | PermutationPlane, Field(discriminator="kind")]


class Label(_Frozen):
    """Where the contract came from: declared by a person, or inferred (with the evidence used)."""

    kind: Literal["declared", "inferred"]
    evidence: tuple[str, ...] = Field(min_length=1)


class GritRecord(_Frozen):
    """The GRIT grade of the contract (canonical string and 64-bit id in hex), or why there is none."""

    expressible: bool
    grade: str | None
    grade_id: str | None
    why: str | None

    @model_validator(mode="after")
    def _consistent(self) -> GritRecord:
        if self.expressible and (self.grade is None or self.grade_id is None or self.why is not None):
            raise ValueError("an expressible GRIT record has a grade and a grade_id and no why")
        if not self.expressible and (self.why is None or self.grade is not None or self.grade_id is not None):
            raise ValueError("an inexpressible GRIT record has a why and no grade")
        if self.grade_id is not None and not re.fullmatch(r"[0-9a-f]{16}", self.grade_id):
            raise ValueError("grade_id is 16 lowercase hex digits")
        return self


class FloatContract(_Frozen):
    """An unquantized float plane, decoded by widening to binary32."""

    family: Literal["float"]
    plane: str
    physical_dtype: Literal["F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"]
    format: FloatFormat
    decode_law: Literal["float_upcast"]
    label: Label
    grit: GritRecord


class AffineIntContract(_Frozen):
    """Integer codes with per-group scales and an optional zero point: ``y = s·(q - z)``."""

    family: Literal["affine_int"]
    codes: CodesSpec
    scales: ScaleSpec
    zero_point: ZeroPoint
    group_map: GroupMap
    permutation: Permutation
    decode_law: Literal["affine_f32", "affine_round_to_scale_format"]
    label: Label
    grit: GritRecord

    @model_validator(mode="after")
    def _integer_codes(self) -> AffineIntContract:
        if self.codes.encoding == "e2m1":
            raise ValueError("e2m1 (FP4) codes are an mx_block contract, not affine_int")
        return self


class GgufBlockContract(_Frozen):
    """A GGUF tensor; every numeric field is implied by its ggml type, which is the declared format."""

    family: Literal["gguf_block"]
    ggml_type: GgmlType
    plane: str
    decode_law: Literal["ggml_block"]
    label: Label
    grit: GritRecord


class GlobalScaleNone(_Frozen):
    """No per-tensor scale: the block scale is the scale."""

    kind: Literal["none"]


class GlobalScalePlane(_Frozen):
    """A per-tensor binary32 scale ``g`` (a one-element plane) applied to every block scale in binary32.

    ``law``: ``divide`` — ``s = f32(block) / g`` (compressed-tensors ``weight_global_scale``);
    ``multiply`` — ``s = f32(block) * g`` (ModelOpt ``weight_scale_2``, GRIT's per-tensor ``s1``).
    """

    kind: Literal["plane"]
    plane: str
    physical_dtype: Literal["F32"]
    physical_shape: tuple[int, ...]
    law: Literal["divide", "multiply"]


GlobalScale = Annotated[GlobalScaleNone | GlobalScalePlane, Field(discriminator="kind")]


class MicroscaleContract(_Frozen):
    """FP4 (E2M1) codes with one narrow scale per block of K: MXFP4 and NVFP4 (:mod:`.microscaling`).

    ``scheme``: ``mxfp4`` — E8M0 block scales, blocks of 32, no global scale; ``nvfp4`` — E4M3 block
    scales, blocks of 16, a binary32 global scale. The codes are 4-bit E2M1 (every pattern a value),
    two per byte along K, low nibble first. ``decode_law``: ``mx_f32`` — ``y = f32(e2m1(q) · s)``;
    ``mx_round_bf16`` — that product rounded to bfloat16 (compressed-tensors' decompressor).
    The structure mirrors :class:`AffineIntContract` (no zero point, no group map) so placement
    follows its planes the same way.
    """

    family: Literal["mx_block"]
    scheme: Literal["mxfp4", "nvfp4"]
    codes: CodesSpec
    scales: ScaleSpec
    global_scale: GlobalScale
    permutation: Permutation
    decode_law: Literal["mx_f32", "mx_round_bf16"]
    label: Label
    grit: GritRecord

    @property
    def zero_point(self) -> ZeroNone:
        """No zero point (``s·q``), as placement reads an affine contract's."""
        return ZeroNone(kind="none")

    @property
    def group_map(self) -> GroupMapNone:
        """Column ``k`` is in block ``k // G``."""
        return GroupMapNone(kind="none")


Contract = Annotated[
    FloatContract | AffineIntContract | GgufBlockContract | MicroscaleContract, Field(discriminator="family")
]


def contract_planes(
    contract: FloatContract | AffineIntContract | GgufBlockContract | MicroscaleContract,
) -> dict[str, PlaneRole]:
    """Return the tensor names the contract reads, with their roles."""
    if isinstance(contract, MicroscaleContract):
        names: dict[str, PlaneRole] = {contract.codes.plane: "codes", contract.scales.plane: "scale"}
        if isinstance(contract.global_scale, GlobalScalePlane):
            names[contract.global_scale.plane] = "global_scale"
        if isinstance(contract.permutation, PermutationPlane):
            names[contract.permutation.plane] = "perm"
        return names
    if not isinstance(contract, AffineIntContract):
        return {contract.plane: "float" if contract.family == "float" else "codes"}
    names = {contract.codes.plane: "codes", contract.scales.plane: "scale"}
    if isinstance(contract.zero_point, ZeroIntPlane | ZeroFloatPlane):
        names[contract.zero_point.plane] = "zero"
    if isinstance(contract.group_map, GroupMapIndex):
        names[contract.group_map.plane] = "g_idx"
    if isinstance(contract.permutation, PermutationPlane):
        names[contract.permutation.plane] = "perm"
    return names


class GraphBinding(_Frozen):
    """Where the weight sits in the model graph: operator slot (``mlp.down_proj``), layer, expert, tie."""

    architecture: str | None
    layer: int | None = Field(ge=0)
    slot: str = Field(min_length=1)
    expert: int | None = Field(ge=0)
    tied_alias: str | None


class LogicalShape(_Frozen):
    """Named logical axes and their extents: ``(N, K)``, ``(N,)`` or ``(E, N, K)``."""

    axes: tuple[LogicalAxis, ...]
    extents: tuple[int, ...]

    @model_validator(mode="after")
    def _structure(self) -> LogicalShape:
        if self.axes not in (("N",), ("N", "K"), ("E", "N", "K")):
            raise ValueError(f"logical axes {self.axes} must be (N,), (N, K) or (E, N, K)")
        if len(self.extents) != len(self.axes) or any(extent < 1 for extent in self.extents):
            raise ValueError(f"extents {self.extents} must be positive, one per axis")
        return self

    @property
    def rows(self) -> int:
        """Rows as decoders see them: every axis but K, flattened."""
        count = 1
        for axis, extent in zip(self.axes, self.extents, strict=True):
            count *= extent if axis != "K" else 1
        return count

    @property
    def columns(self) -> int:
        """Extent of K (1 for vectors)."""
        return self.extents[-1] if self.axes[-1] == "K" else 1


class PlaneRef(_Frozen):
    """One tensor bound to a logical weight, with its role and physical dtype/shape."""

    role: PlaneRole
    tensor: str
    dtype: str
    shape: tuple[int, ...]


class DecodeWitness(_Frozen):
    """Seeded rows of the reference decode (little-endian binary32, base64) and optional error."""

    seed: int = Field(ge=0, le=2**53 - 1)  # manifests are RFC 8785 JSON: integers stay exact below 2^53
    rows: tuple[int, ...] = Field(min_length=1)
    columns: int = Field(ge=1)
    values_f32le: str
    values_sha256: str
    rel_error: float | None = Field(ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _structure(self) -> DecodeWitness:
        raw = base64.b64decode(self.values_f32le, validate=True)
        if len(raw) != 4 * len(self.rows) * self.columns:
            raise ValueError(f"witness holds {len(raw)} bytes, expected {4 * len(self.rows) * self.columns}")
        if hashlib.sha256(raw).hexdigest() != self.values_sha256:
            raise ValueError("witness values do not match values_sha256")
        return self


#: Bytes of each cell digest of a :class:`CellWitness` (truncated sha256 of the cell's binary32 bytes).
CELL_DIGEST_BYTES = 4


class CellWitness(_Frozen):
    """Digests of the reference decode over a grid of cells that every split of the weight meets.

    A cell is one row ``r`` and the columns ``[b·align, min(b·align + width, K))`` of it, for a column
    block ``b``: ``align`` is the weight's alignment along K (the lcm of its group size, block size and
    packed word; every split point along K is a multiple of it) and ``width <= align``. Rows (of each
    expert: ``experts`` is E for ``[E, N, K]`` weights, else 1; ``rows`` is N) are
    ``row_grid = (first, stride, count)``: ``first + i·stride`` for ``i < count``, plus the last row; the
    column blocks are ``block_grid`` likewise, plus the last block. Cell ``i`` pairs row ``i mod R``
    with block ``i mod B`` (``max(R, B)`` cells; :func:`cell_positions`). ``digests``: base64 of, for
    each expert then each cell, the first 4 bytes of sha256 of the cell's little-endian binary32
    decode. ``rel_error``: the Frobenius relative error to ``--reference``, when one was given.
    """

    kind: Literal["cells"]
    seed: int = Field(ge=0, le=2**53 - 1)
    experts: int = Field(ge=1)
    rows: int = Field(ge=1)
    columns: int = Field(ge=1)
    align: int = Field(ge=1)
    width: int = Field(ge=1)
    row_grid: tuple[int, int, int]
    block_grid: tuple[int, int, int]
    digests: str
    rel_error: float | None = Field(ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _structure(self) -> CellWitness:
        blocks = -(-self.columns // self.align)
        for name, (first, stride, count), extent in (
            ("row_grid", self.row_grid, self.rows),
            ("block_grid", self.block_grid, blocks),
        ):
            if stride < 1 or count < 1 or first < 0 or first + (count - 1) * stride >= extent:
                raise ValueError(f"{name} {(first, stride, count)} does not fit an extent of {extent}")
        if self.width > self.align:
            raise ValueError(f"cell width {self.width} exceeds the alignment {self.align}")
        raw = base64.b64decode(self.digests, validate=True)
        expected = self.experts * len(cell_positions(self)) * CELL_DIGEST_BYTES
        if len(raw) != expected:
            raise ValueError(f"witness holds {len(raw)} digest bytes, expected {expected}")
        return self


class QuantError(BaseModel):
    """A quantized weight's distance from its float reference (``push --reference``), per weight.

    ``max_abs``: ``max |W_q - W_fp|``; ``rel_frobenius``: ``‖W_q - W_fp‖/‖W_fp‖``; ``e_quant``:
    ``‖X·(W_q - W_fp)^T‖/‖X·W_fp^T‖`` for ``tokens`` seeded standard-normal activations ``X``;
    ``tolerance``: ``‖B‖/‖W_fp‖``, ``B`` the honest rounding bound of each element (half its
    quantization step plus scale rounding, :mod:`.rounding`); ``clipped``: elements beyond their bound
    at an edge code. Six significant digits (the same bytes on any BLAS).
    """

    model_config = ConfigDict(frozen=True, extra="allow")
    max_abs: float = Field(ge=0, allow_inf_nan=False)
    rel_frobenius: float = Field(ge=0, allow_inf_nan=False)
    e_quant: float = Field(ge=0, allow_inf_nan=False)
    tolerance: float = Field(ge=0, allow_inf_nan=False)
    tokens: int = Field(ge=1)
    seed: int = Field(ge=0, le=2**53 - 1)
    clipped: int = Field(ge=0)


def _grid(first: int, stride: int, count: int, last: int) -> list[int]:
    points = [first + i * stride for i in range(count)]
    return points if points[-1] == last else [*points, last]


def cell_positions(witness: CellWitness) -> list[tuple[int, int, int]]:
    """The cells ``(row, first column, stop column)`` of one expert, in digest order."""
    rows = _grid(*witness.row_grid, witness.rows - 1)
    blocks = _grid(*witness.block_grid, (witness.columns - 1) // witness.align)
    out = []
    for i in range(max(len(rows), len(blocks))):
        start = blocks[i % len(blocks)] * witness.align
        out.append((rows[i % len(rows)], start, min(start + witness.width, witness.columns)))
    return out


class LogicalWeight(_Frozen):
    """A logical weight: name, shape, planes by role, contract, graph binding and decode witness."""

    name: str = Field(min_length=1)
    shape: LogicalShape
    planes: tuple[PlaneRef, ...]
    contract: Contract
    binding: GraphBinding
    witness: DecodeWitness | CellWitness | None

    @field_validator("planes")
    @classmethod
    def _unique(cls, planes: tuple[PlaneRef, ...]) -> tuple[PlaneRef, ...]:
        names = [plane.tensor for plane in planes]
        if len(set(names)) != len(names):
            raise ValueError(f"planes name a tensor twice: {names}")
        return planes

    @model_validator(mode="after")
    def _planes_cover_contract(self) -> LogicalWeight:
        bound = {plane.tensor: plane.role for plane in self.planes}
        for tensor, role in contract_planes(self.contract).items():
            if bound.get(tensor) != role:
                raise ValueError(f"contract reads {tensor} as {role}, planes bind it as {bound.get(tensor)}")
        return self


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """A tensor as a container parser reports it: name, dtype string, shape.

    dtype uses safetensors spellings (``F16``, ``I32``…) or, for GGUF, the ggml type name (``Q4_K``);
    for GGUF the shape is the logical element shape in row-major order (ggml ``ne`` reversed).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
