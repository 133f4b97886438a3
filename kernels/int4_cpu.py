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

Repack (load time, :mod:`.int4_form`): with ``lo`` the least value of the code encoding, ``u = q - lo``
and, for ``w = s·(q - z)``, ``scale = s``, ``zero = s·(8 + lo - z)`` (GPTQ, AWQ, compressed-tensors int4);
GGUF Q4_0 ``w = d·(q - 8)``: ``scale = d``, ``zero = 0``; Q4_1 ``w = d·q + m``: ``scale = d``, ``zero = m +
8d``. In float32 all of these are exact for binary16 scales (the products are small-integer multiples of
an 11-bit significand); where the activation dtype is bfloat16 (or a zero does not fit float16) the
scale/zero cast rounds, and the preparation is labelled a ``conversion`` with its largest reconstruction
error. compressed-tensors' decode law rounds each product to the scale format; the kernel does not,
which is also a conversion.

Cost (N = K = 4096, one thread): the codes are split into uint8 in one pass, then packed by the byte
map learnt from the converter at run time (:mod:`.int4_bytemap`: a pairing pass and a strided
transpose per 64-row block, byte-identical to the converter, checked on each weight's first and last
blocks); the converter itself (a scalar loop over every code, int32 only: torch 2.13 checks ``kInt``)
packs where the map is refused, ``PACK_ROWS`` rows at a time (whole 64-row blocks: the same bytes as
one call, a bounded int32 workspace). Parity L1 reads the codes back through the same map on sampled
ladders and through the kernel itself (and the map, compared) on full ones. The conversion error is
taken over each group's 16 possible codes (:func:`.int4_form.table_error`), not over every element.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .budget import EPS, TINY, Budget, affine_terms_magnitude, law_eps, rounding_budget
from .capability import Capability, OperatorSignature
from .device import cpu_isa
from .errors import ByteMapError, KernelInputError
from .int4_bytemap import BLOCK_ROWS, U8, byte_map, kernel_codes, refuse
from .int4_form import Int4Form as Int4Form  # re-exported: the CUDA kernel and tests use them
from .int4_form import int4_terms as int4_terms
from .int4_form import table_error
from .prepared import F32, I64, ROW_CHUNK, Codes, PreparedLinear
from .weight import RankWeight

GROUPS = (32, 64, 128, 256)
#: Rows widened to int32 and packed per converter call: whole 64-row blocks (the widest N block of any
#: ISA's layout, and the AVX2/DEFAULT 32-row blocks tile it), so the chunks pack to the same bytes as one
#: call over all rows; the int32 workspace is ``PACK_ROWS · K · 4`` bytes.
PACK_ROWS = 256

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
    # Vectorised for bfloat16 only (torch 2.13, N = K = 4096, one thread): bfloat16 0.4-0.9 ms at T = 1,
    # 6-13 ms at T = 32; float32 14-28 ms and 470-920 ms, float16 31 ms and 1.3 s (linear in T).
    slow_activations=("float32", "float16"),
)


_CODES_MINUS_8 = np.arange(16, dtype=np.float32) - np.float32(8)


def pack_codes(u: npt.NDArray[np.integer[Any]]) -> Any:
    """Codes ``u [N, K]`` (0..15, checked by the caller) → int4pack's uint8 ``[N, K/2]`` under this ISA."""
    import torch

    n, k = u.shape
    packed = torch.empty((n, k // 2), dtype=torch.uint8)
    codes = torch.from_numpy(np.ascontiguousarray(u))
    convert = torch.ops.aten._convert_weight_to_int4pack_for_cpu
    for r in range(0, n, PACK_ROWS):
        stop = min(r + PACK_ROWS, n)
        packed[r:stop] = convert(codes[r:stop].to(torch.int32), 1)
    return packed


def pack_int4(u: npt.NDArray[np.integer[Any]], where: str) -> tuple[Any, str | None]:
    """Codes ``u [N, K]`` (0..15, checked) → int4pack bytes under this ISA, and why not by the byte map.

    By the byte map learnt from the converter (:mod:`.int4_bytemap`, strided copies instead of the
    converter's scalar loop) where one is learnt and, on this weight's first 64-row block and its last
    block with the tail, gives the converter's bytes exactly; else by the converter (:func:`pack_codes`),
    with the reason (None when the map packed). A map that disagrees is refused for the process.
    """
    import torch

    n, k = u.shape
    try:
        learnt = byte_map(k, n % BLOCK_ROWS)
    except ByteMapError as refused:
        return pack_codes(u), str(refused)
    codes = u if u.dtype in (np.uint8, np.int8) else u.astype(np.uint8)  # 0..15: exact
    packed = learnt.pack(codes)
    last = n - BLOCK_ROWS - learnt.tail if n > 2 * BLOCK_ROWS + learnt.tail else 0
    for start, stop in sorted({(0, min(n, BLOCK_ROWS)), (last, n)}):
        want = pack_codes(codes[start:stop]).numpy()
        if not np.array_equal(packed[start:stop], want):
            r, c = (int(i) for i in np.argwhere(packed[start:stop] != want)[0])
            refusal = ByteMapError(
                where,
                f"int4pack byte {c} of row {start + r} packed by the byte map ({learnt.isa}, K {k})",
                f"the converter's {int(want[r, c])}",
                int(packed[start + r, c]),
                "the map is refused for this process; packed by the converter",
            )
            refuse(learnt, refusal)
            return pack_codes(u), str(refusal)
    return torch.from_numpy(packed), None


class PreparedInt4(PreparedLinear):
    """A rank's weight packed for ``_weight_int4pack_mm_for_cpu`` (ISA-keyed, never persisted)."""

    def __init__(self, weight: RankWeight, op: OperatorSignature, kernel: str) -> None:
        import torch

        form = int4_terms(weight)
        dtype = getattr(torch, op.activation_dtype)
        isa = cpu_isa()
        self.packed, self.map_refusal = pack_int4(form.u, weight.where)
        sz = np.stack([form.scale, form.zero], axis=-1)
        self.scale_zero = torch.from_numpy(sz).to(dtype).contiguous()
        self.group = form.group
        self._sz32: F32 | None = None
        exact = self.scale_zero.double().numpy()
        super().__init__(kernel, op, "repack", isa=isa)
        error = self._decode_error(form)
        if error or not np.array_equal(exact, sz):
            self.transformation = "conversion"
        self.conversion_error = error
        self._sz32 = None

    def _decode_error(self, form: Int4Form) -> float:
        """Largest ``|W_layout - W_reference|`` over the slice (from the code tables where there are some)."""
        if form.reference_table is not None:
            return table_error(form, self._layout_table)
        worst = 0.0
        for r in range(0, self.op.n_local, 4 * ROW_CHUNK):
            stop = min(r + 4 * ROW_CHUNK, self.op.n_local)
            ref = form.reference_rows(r, stop)
            mine = self._decode_from(form.u[r:stop], r, stop)
            diff = np.abs(mine.astype(np.float64) - ref.astype(np.float64))
            worst = max(worst, float(diff.max()) if diff.size else 0.0)
        return worst

    def _layout_table(self, rows: I64, groups: I64) -> F32:
        """``(u - 8)·scale + zero`` for u = 0..15 in group ``groups[i]`` of row ``rows[i]``: ``[len, 16]``.

        The same binary32 operations, in the same order, as :meth:`_decode_from` applies per element.
        """
        if self._sz32 is None:
            self._sz32 = self.scale_zero.float().numpy()
        sz = self._sz32[groups, rows]  # [len, 2]
        out: F32 = (_CODES_MINUS_8 * sz[:, 0:1] + sz[:, 1:2]).astype(np.float32)
        return out

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
        """Read the codes back out of the packed bytes by running the kernel itself (:func:`kernel_codes`).

        Returns ``u [n_local, len(columns)]`` (int8; -1 marks an output the probe cannot read).
        """
        self._check_isa()
        found: I64 = kernel_codes(self.packed, self.op.n_local, self.op.k_local, self.group, columns)  # type: ignore[assignment]
        return found

    def map_codes(self) -> U8 | None:
        """The codes read back out of the packed bytes through the byte map learnt from the converter.

        None where the map is refused under this ISA or disagreed with the converter when this weight
        was packed (:attr:`map_refusal` says why; the kernel read-back :meth:`probe_codes` is then the
        only one).
        """
        self._check_isa()
        if self.map_refusal is not None:
            return None
        try:
            learnt = byte_map(self.op.k_local, self.op.n_local % BLOCK_ROWS)
        except ByteMapError as refused:
            self.map_refusal = str(refused)
            return None
        return learnt.unpack(self.packed.numpy())

    def map_check(self, weight: RankWeight) -> tuple[Codes, Codes] | None:
        """(codes by the registry's generic unpacking, codes read back through the byte map), as uint8.

        The generic unpacking range-checks every code to 0..15, so the uint8 cast is exact.
        """
        found = self.map_codes()
        if found is None:
            return None
        return int4_terms(weight, fast=False).u.astype(np.uint8), found

    def kernel_columns(self, columns: npt.NDArray[np.int64]) -> Codes | None:
        """The kernel's own read-back of K ``columns`` over every row (:meth:`probe_codes`)."""
        found: Codes = self.probe_codes(columns)
        return found

    def code_check(self, weight: RankWeight) -> tuple[I64, I64] | None:
        """(codes the planes hold, by the registry's generic unpacking; codes read back from the layout)."""
        return int4_terms(weight, fast=False).u.astype(np.int64, copy=False), self.probe_codes()

    def read_back(self, weight: RankWeight) -> tuple[F32, tuple[I64, I64] | None]:
        """The layout's decode and (expected, read-back) codes, the codes read back once for both."""
        found = self.probe_codes()
        expected = int4_terms(weight, fast=False).u.astype(np.int64, copy=False)
        return self._decode_from(found, 0, self.op.n_local), (expected, found)

    def conversion_budget(self, weight: RankWeight, reference: F32) -> Budget | None:
        """(scale, zero) held in the activation dtype; the decode law's rounding where the kernel skips it."""
        form = int4_terms(weight, fast=False)
        dtype = self.op.activation_dtype
        return rounding_budget(
            affine_terms_magnitude(form.u, form.scale, form.zero, form.group),
            reference,
            held_in=f"int4pack's (scale, zero) in {dtype}",
            eps_terms=EPS[dtype],
            eps_law=law_eps(weight.contract),
            tiny=TINY[dtype],
            what="|u - 8|·|scale| + |zero|",
        )

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
