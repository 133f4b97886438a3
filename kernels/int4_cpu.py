"""CPU packed int4: torch's ``_weight_int4pack_mm_for_cpu`` over ``_convert_weight_to_int4pack_for_cpu``.

The contract, learnt by experiment on torch 2.13 (CPU build) and checked before every call:

- ``_convert_weight_to_int4pack_for_cpu(w, innerKTiles)``: ``w`` int32 ``[N, K]`` of codes ``u`` in
  0..15, N % 16 == 0, K even; returns uint8 ``[N, K/2]`` (innerKTiles does not change the bytes). The
  byte layout depends on the ISA torch dispatches to (AVX512 pairs rows ``d`` and ``d+32`` of each
  64-row block in one byte; AVX2 and DEFAULT differ): a load-time product, keyed by ISA, never
  persisted. It does not range-check codes: a code of 17 or -1 corrupts the neighbour row sharing its
  byte, silently.
- ``_weight_int4pack_mm_for_cpu(x, packed, group, sz)``: ``x`` 2-D contiguous ``[T, K]`` float32,
  bfloat16 or float16; ``group`` in {32, 64, 128, 256}; ``K % group == 0``; ``sz`` ``[G, N, 2]`` in
  ``x``'s dtype holding (scale, zero) with ``w = (u - 8)·scale + zero``; output ``[T, N]`` in ``x``'s
  dtype. It checks ``sz``'s N and last dims but not G: a short scale plane reads out of bounds.

Repack (load time, from the registry's exact unpacking :func:`affine_terms`): with ``lo`` the least
value of the code encoding, ``u = q - lo`` and, for ``w = s·(q - z)``, ``scale = s``, ``zero =
s·(8 + lo - z)`` (GPTQ, AWQ, compressed-tensors int4); GGUF Q4_0 ``w = d·(q - 8)``: ``scale = d``,
``zero = 0``; Q4_1 ``w = d·q + m``: ``scale = d``, ``zero = m + 8d``. In float32 all of these are exact
for binary16 scales (the products are small-integer multiples of an 11-bit significand); where the
activation dtype is bfloat16 (or a zero does not fit float16) the scale/zero cast rounds, and the
preparation is labelled a ``conversion`` with its largest reconstruction error. compressed-tensors'
decode law rounds each product to the scale format; the kernel does not, which is also a conversion.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardport.registry.contracts.decode import affine_terms, decode_weight
from shardport.registry.contracts.encodings import encoding_value_range
from shardport.registry.contracts.formats import round_to_format
from shardport.registry.contracts.gguf_blocks import as_gguf_rows
from shardport.registry.contracts.model import AffineIntContract, GgufBlockContract, LogicalShape, Packing

from .capability import Capability, OperatorSignature
from .device import cpu_isa
from .errors import KernelInputError
from .prepared import F32, I64, ROW_CHUNK, PreparedLinear
from .weight import RankWeight

GROUPS = (32, 64, 128, 256)
F64 = npt.NDArray[np.float64]

CAPABILITY = Capability(
    id="cpu.int4pack",
    version="1",
    abi="torch>=2.6 aten._weight_int4pack_mm_for_cpu/_convert_weight_to_int4pack_for_cpu",
    layouts=("affine:u4:*", "affine:s4_twos:*", "affine:s4_offset8:*", "gguf:Q4_0", "gguf:Q4_1"),
    code_encodings=("u4", "s4_twos", "s4_offset8"),
    scale_formats=("binary16", "bfloat16", "binary32"),
    scale_signs=("positive", "signed"),
    scale_levels=(1,),
    zero_points=("none", "implicit", "int_plane/as_is", "int_plane/minus_one", "float_min"),
    group_sizes=GROUPS,
    scale_per_row=False,
    n_multiple=16,
    k_multiple=32,
    cpu_isas=("AVX512", "AVX2", "DEFAULT"),
    transformation="repack",
)


@dataclass(frozen=True)
class Int4Form:
    """A rank's weight in int4pack's terms.

    ``u [N, K]``: codes in 0..15; ``scale``/``zero`` ``[G, N]`` (float64, exact); ``group``: the group
    size; ``reference_rows``: the decode law's rows (binary32) from the same unpacking.
    """

    u: I64
    scale: F64
    zero: F64
    group: int
    reference_rows: Callable[[int, int], F32]


def _gguf_q4(c: GgufBlockContract, weight: RankWeight) -> Int4Form:
    """Q4_0 / Q4_1 blocks: ``u`` the nibbles, ``scale = d``, ``zero = 0`` or ``m + 8d``."""
    n, k = weight.n_local, weight.k_local
    head = 2 if c.ggml_type == "Q4_0" else 4
    rows = as_gguf_rows(weight.planes["codes"], c.ggml_type, n, k, c.plane)
    blocks = rows.reshape(n, k // 32, head + 16)
    d = np.ascontiguousarray(blocks[:, :, 0:2]).view("<f2")[..., 0].astype(np.float64)
    qs = blocks[:, :, head:]
    u = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, k).astype(np.int64)
    if c.ggml_type == "Q4_0":
        zero = np.zeros_like(d)
    else:
        m = np.ascontiguousarray(blocks[:, :, 2:4]).view("<f2")[..., 0].astype(np.float64)
        zero = m + 8.0 * d
    local = weight.local_weight

    def reference_rows(start: int, stop: int) -> F32:
        return decode_weight(local, weight.named_planes, range(start, stop))

    return Int4Form(u, d.T.copy(), zero.T.copy(), 32, reference_rows)


def _nibbles(c: AffineIntContract, plane: npt.NDArray[Any], n: int, k: int) -> npt.NDArray[np.uint8] | None:
    """The stored 4-bit fields ``[N, K]`` of 32-bit slots/bitstream codes, vectorized; None if not that form.

    Slot ``i`` (bits ``4i..4i+3`` from the LSB) holds run element ``slot_order[i]``; a 4-bit bitstream in
    32-bit containers is the identity slot order. The registry's generic unpacking is the oracle (the
    parity ladder compares against it).
    """
    codes, pack = c.codes, c.codes.packing
    extents = {"N": n, "K": k}
    if codes.bits != 4 or pack.container_bits != 32 or pack.axis == "none" or pack.bit_order != "lsb_first":
        return None
    if extents[pack.axis] % 8 or plane.dtype.itemsize != 4 or plane.ndim != 2:
        return None
    order = pack.slot_order if pack.scheme == "slots" else tuple(range(8))
    words = plane.view(np.uint32)
    words = words if codes.physical_axes[-1] == pack.axis else words.T  # [other, words along the pack axis]
    fields = np.empty((*words.shape, 8), dtype=np.uint8)
    for slot, element in enumerate(order):
        fields[:, :, element] = (words >> np.uint32(4 * slot)) & np.uint32(0xF)
    stored = fields.reshape(words.shape[0], words.shape[1] * 8)
    return np.ascontiguousarray(stored if pack.axis == "K" else stored.T)


def _unpacked_contract(
    c: AffineIntContract, weight: RankWeight
) -> tuple[AffineIntContract, dict[str, npt.NDArray[Any]]]:
    """The contract and planes with the codes replaced by their unpacked fields (one per byte) when fast."""
    planes = weight.named_planes
    stored = _nibbles(c, planes[c.codes.plane], weight.n_local, weight.k_local)
    if stored is None:
        return c, planes
    twos = "_twos" in c.codes.encoding  # unpacked containers hold the signed value itself
    values = np.where(stored >= 8, stored.astype(np.int8) - 16, stored).astype(np.int8) if twos else stored
    plain = Packing(
        axis="none", container_bits=8, scheme="slots", slot_order=(0,), bit_order="lsb_first", tail="exact"
    )
    spec = c.codes.model_copy(
        update={
            "physical_dtype": "I8" if twos else "U8",
            "physical_shape": (weight.n_local, weight.k_local),
            "physical_axes": ("N", "K"),
            "packing": plain,
        }
    )
    return c.model_copy(update={"codes": spec}), {**planes, c.codes.plane: values}


def _affine(c: AffineIntContract, weight: RankWeight, *, fast: bool = True) -> Int4Form:
    """GPTQ / AWQ / compressed-tensors int4 via :func:`affine_terms` (codes pre-unpacked when ``fast``)."""
    shape = LogicalShape(axes=("N", "K"), extents=(weight.n_local, weight.k_local))
    c, planes = _unpacked_contract(c, weight) if fast else (c, weight.named_planes)
    terms = affine_terms(c, planes, shape, None, weight.where)
    lo = encoding_value_range(c.codes.encoding)[0]
    s = terms.scale.astype(np.float64)
    z = terms.zero.astype(np.float64)
    group = terms.group

    def reference_rows(start: int, stop: int) -> F32:  # the decode law, as decode_affine evaluates it
        q, zero = terms.q[start:stop], terms.zero[start:stop][:, group]
        if zero.dtype == np.int64:
            diff = (q - zero).astype(np.float32)
        else:
            diff = q.astype(np.float32) - zero.astype(np.float32)
        values: F32 = diff * terms.scale[start:stop][:, group]
        if c.decode_law == "affine_round_to_scale_format":
            values = round_to_format(values, c.scales.format)
        return values

    return Int4Form(
        terms.q - lo, s.T.copy(), (s * (8.0 + lo - z)).T.copy(), c.scales.group_size, reference_rows
    )


def int4_terms(weight: RankWeight, *, fast: bool = True) -> Int4Form:
    """The int4pack form of a rank's weight, its codes range-checked and its scale count checked.

    ``fast``: unpack 4-bit codes in 32-bit words with a vectorized nibble split (else the registry's
    generic per-field unpacking, the oracle the parity ladder uses).
    """
    c = weight.contract
    if isinstance(c, GgufBlockContract):
        form = _gguf_q4(c, weight)
    elif isinstance(c, AffineIntContract):
        form = _affine(c, weight, fast=fast)
    else:
        raise KernelInputError(weight.where, "contract family", "affine_int or gguf Q4_0/Q4_1", c.family)
    u, scale, zero, group = form.u, form.scale, form.zero, form.group
    bad = (u < 0) | (u > 15)
    if bad.any():
        r, k = (int(i) for i in np.argwhere(bad)[0])
        raise KernelInputError(
            weight.where,
            f"code at row {weight.row_start + r} column {weight.col_start + k}",
            "0..15 after the encoding's offset",
            int(u[r, k]),
            "int4pack does not range-check codes; an out-of-range code would corrupt its neighbour row",
        )
    groups = weight.k_local // group
    if weight.k_local % group or scale.shape != (groups, weight.n_local) or zero.shape != scale.shape:
        raise KernelInputError(
            weight.where,
            "scale/zero plane",
            f"[{groups}, {weight.n_local}] (K_local {weight.k_local} / group {group})",
            list(scale.shape),
            "int4pack does not check the number of groups; a short plane would be read out of bounds",
        )
    return form


class PreparedInt4(PreparedLinear):
    """A rank's weight packed for ``_weight_int4pack_mm_for_cpu`` (ISA-keyed, never persisted)."""

    def __init__(self, weight: RankWeight, op: OperatorSignature, kernel: str) -> None:
        import torch

        form = int4_terms(weight)
        u, scale, zero, group = form.u, form.scale, form.zero, form.group
        dtype = getattr(torch, op.activation_dtype)
        isa = cpu_isa()
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            torch.from_numpy(u.astype(np.int32)), 1
        )
        sz = np.stack([scale, zero], axis=-1)
        self.scale_zero = torch.from_numpy(sz).to(dtype).contiguous()
        self.group = group
        self._sz32: F32 | None = None
        exact = torch.from_numpy(sz).to(dtype).double().numpy()
        super().__init__(kernel, op, "repack", isa=isa)
        error = self._decode_error(form)
        if error or not np.array_equal(exact, sz):
            self.transformation = "conversion"
        self.conversion_error = error
        self._sz32 = None

    def _decode_error(self, form: Int4Form) -> float:
        """Largest ``|W_layout - W_reference|`` over the slice, a chunk of rows at a time."""
        worst = 0.0
        for r in range(0, self.op.n_local, 4 * ROW_CHUNK):
            stop = min(r + 4 * ROW_CHUNK, self.op.n_local)
            ref = form.reference_rows(r, stop)
            mine = self._decode_from(form.u[r:stop], r, stop)
            diff = np.abs(mine.astype(np.float64) - ref.astype(np.float64))
            worst = max(worst, float(diff.max()) if diff.size else 0.0)
        return worst

    def _decode_from(self, u: npt.NDArray[np.integer[Any]], start: int, stop: int) -> F32:
        if self._sz32 is None:
            self._sz32 = self.scale_zero.float().numpy()
        sz = self._sz32[:, start:stop]  # [G, rows, 2]
        group = np.arange(u.shape[1]) // self.group
        scale = sz[group, :, 0].T
        zero = sz[group, :, 1].T
        out: F32 = ((u.astype(np.float32) - np.float32(8)) * scale + zero).astype(np.float32)
        return out

    def _run(self, x: Any) -> Any:
        import torch

        groups = self.op.k_local // self.group
        if tuple(self.scale_zero.shape) != (groups, self.op.n_local, 2):  # belt and braces: OOB read
            raise KernelInputError(
                self.op.weight, "scale_zero", [groups, self.op.n_local, 2], list(self.scale_zero.shape)
            )
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, self.scale_zero)

    @property
    def resident_bytes(self) -> int:
        """Packed codes + the (scale, zero) pairs: all this operator keeps."""
        held = self.packed.numel() * self.packed.element_size()
        return int(held + self.scale_zero.numel() * self.scale_zero.element_size())

    def probe_codes(self, columns: npt.NDArray[np.int64] | None = None) -> I64:
        """Read the codes back out of the packed bytes by running the kernel itself.

        Every (scale, zero) is (1, 0), so the kernel computes ``Σ_k x[t, k]·(u[n, k] - 8)``; activation row
        ``t`` (bfloat16) holds 1 at one column ``a`` and 16 at another ``b`` (``columns``: which K columns;
        all when None), so the output is ``(u_a - 8) + 16·(u_b - 8)``, an integer in -136..119: exact in
        bfloat16 (every partial sum too), and ``+ 136`` gives back ``u_a + 16·u_b`` -- two codes per row,
        under the ISA that packed it. An output that is not such an integer (a kernel that does not
        compute what the probe assumes) reads back as code -1, which no plane holds. Returns
        ``u [n_local, len(columns)]``.
        """
        import torch

        self._check_isa()
        k, n = self.op.k_local, self.op.n_local
        cols = np.arange(k) if columns is None else np.asarray(columns, dtype=np.int64)
        ones = torch.zeros(k // self.group, n, 2, dtype=torch.bfloat16)
        ones[..., 0] = 1.0
        out = torch.empty(cols.size, n, dtype=torch.int16)  # [position, n]; returned transposed
        for at in range(0, cols.size, 8 * ROW_CHUNK):
            stop = min(at + 8 * ROW_CHUNK, cols.size)
            lo = torch.from_numpy(cols[at:stop:2])  # probed at weight 1
            hi = torch.from_numpy(cols[at + 1 : stop : 2])  # at weight 16 (none for a last odd column)
            x = torch.zeros(lo.numel(), k, dtype=torch.bfloat16)
            x[torch.arange(lo.numel()), lo] = 1.0
            x[torch.arange(hi.numel()), hi] = 16.0
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, ones)  # [rows, n]
            v = y.to(torch.int16)
            bad = (v.to(torch.bfloat16) != y) | (v < -136) | (v > 119)
            v += 136
            out[at:stop:2] = (v & 15).masked_fill_(bad, -1)
            out[at + 1 : stop : 2] = (v >> 4).masked_fill_(bad, -1)[: hi.numel()]
        found: I64 = out.numpy().T  # int16 codes (-1 marks an output the probe cannot read)
        return found

    def code_check(self, weight: RankWeight) -> tuple[I64, I64] | None:
        """(codes the planes hold, by the registry's generic unpacking; codes read back from the layout)."""
        return int4_terms(weight, fast=False).u, self.probe_codes()

    def read_back(self, weight: RankWeight) -> tuple[F32, tuple[I64, I64] | None]:
        """The layout's decode and (expected, read-back) codes, the codes read back once for both."""
        found = self.probe_codes()
        return self._decode_from(found, 0, self.op.n_local), (int4_terms(weight, fast=False).u, found)

    def decode_rows(self, start: int, stop: int) -> F32:
        """Rows of ``(u - 8)·scale + zero`` with ``u`` read back from the packed bytes."""
        return self._decode_from(self.probe_codes()[start:stop], start, stop)

    def decode(self) -> F32:
        """The whole layout decoded, the codes read back through the kernel once."""
        return self._decode_from(self.probe_codes(), 0, self.op.n_local)


class Int4CpuKernel:
    """The packed int4 CPU kernel (see the module docstring for its contract)."""

    capability = CAPABILITY

    def prepare(self, weight: RankWeight, op: OperatorSignature) -> PreparedLinear:
        """Repack the rank's planes into int4pack at load time (checked codes and scale count)."""
        cap = self.capability
        return PreparedInt4(weight, op, f"{cap.id}@{cap.version}")
