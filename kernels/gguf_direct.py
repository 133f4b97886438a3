"""Direct GGUF block kernel: ``y = x @ W.T`` straight from a rank's raw GGUF block bytes.

The rank's block plane (uint8 ``[N, row_bytes]`` exactly as the loader returns it) is used as it is:
no repack, no persistent float copy. The matmul walks the rows ``tile_rows`` at a time; each tile of
rows is decoded into one reused float32 workspace ``[tile_rows, K]`` and multiplied there
(``torch.mm``), so the extra memory is bounded by :func:`workspace_bytes`, whatever N is.

Decoders:

- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and F32/F16/BF16: vectorised torch tile
  decoders written from the block layouts (see ``shardport.registry.contracts.gguf_blocks`` for the
  byte maps). They follow ggml's reference evaluation order (each product and each sum rounded to
  binary32 separately, never fused), so a decoded tile equals ``gguf.quants.dequantize`` bit for bit.
- Every other type ``gguf.quants`` dequantizes (the IQ family, TQ1_0/TQ2_0, MXFP4, NVFP4): the tile
  is decoded by ``gguf.quants.dequantize`` (numpy) in chunks of about 2**17 elements and copied into
  the workspace; those decoders' temporaries (<= 4x a chunk) are counted in the workspace.

Accumulation is float32 (``torch.mm``); bfloat16/float16 activations are widened to float32 first.
The result differs from a float64 product by float32 summation error only (about ``K * 2**-24``
relative to ``|x| @ |W|.T``). :func:`workspace_bytes` does not count the BLAS's own packing buffers
(about 3 MiB more at T = 32, K = 4096, measured). A tile costs about ten small torch ops: run with
torch threads no more than the rank's share of cores (two OpenMP threads on one busy core stall at
every op's barrier, 10-30x slower, measured).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as _gguf_dequantize

from .gguf_errors import (
    ActivationError,
    BlockAlignmentError,
    BlockDtypeError,
    NonContiguousBlocksError,
    RowBytesError,
    UnknownGgmlTypeError,
    WorkspaceError,
)
from .gguf_types import GGUF_DIRECT_TYPES as GGUF_DIRECT_TYPES
from .gguf_types import NATIVE_TYPES as NATIVE_TYPES

#: A tile decoder: raw bytes ``[R, blocks_per_row, type_size]`` (uint8) → ``out`` float32
#: ``[R, blocks_per_row, block_size]``, written in place.
TileDecoder = Callable[[torch.Tensor, torch.Tensor], None]

_U8 = torch.uint8
_F32 = torch.float32


def _half(tile: torch.Tensor, offset: int) -> torch.Tensor:
    """The binary16 at byte ``offset`` of every block, widened: ``[R, B, 1]`` float32."""
    return tile[..., offset : offset + 2].view(torch.float16).to(_F32)


def _unpack(src: torch.Tensor, shifts: tuple[int, ...], mask: int) -> torch.Tensor:
    """``[..., L]`` bytes → uint8 ``[..., len(shifts), L]``: slice i holds ``(src >> shifts[i]) & mask``.

    One scalar shift per slice written into a shared buffer, then one mask over it: a tensor of
    shift amounts broadcast against the bytes is ~3x slower in torch (measured).
    """
    if src.shape[-1] >= 32:  # gathering the strided runs first pays off from 32 bytes on (measured)
        src = src.contiguous()
    dst = torch.empty(*src.shape[:-1], len(shifts), src.shape[-1], dtype=_U8)
    for i, shift in enumerate(shifts):
        torch.bitwise_right_shift(src, shift, out=dst[..., i, :])
    dst &= mask
    return dst


_NIBBLES = (0, 4)
_CRUMBS = (0, 2, 4, 6)
_BITS = (0, 1, 2, 3, 4, 5, 6, 7)

#: Byte value → its 8 bits (bit i at index i), each as 0 or 16: the fifth bit of 5-bit codes, in place.
#: One table lookup per byte is ~3x faster here than eight shifts over 4-byte rows.
_FIFTH_BITS = (((torch.arange(256).unsqueeze(-1) >> torch.arange(8)) & 1) << 4).to(_U8)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """``[..., n]`` bytes → ``[..., n, 8]`` uint8: bit i of each byte, shifted to 16 (0 or 16)."""
    return torch.nn.functional.embedding(qh.to(torch.int32), _FIFTH_BITS)


def _nibble_codes(tile: torch.Tensor, at: int) -> torch.Tensor:
    """32 codes from the 16 bytes at ``at``: element j < 16 low nibble of byte j, j ≥ 16 high nibble."""
    return _unpack(tile[..., at : at + 16], _NIBBLES, 0x0F).view(tile.shape[0], tile.shape[1], 32)


def _decode_q8_0(tile: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(tile[..., 2:].view(torch.int8))
    out.mul_(_half(tile, 0))


def _decode_q4_0(tile: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(_nibble_codes(tile, 2))
    out.sub_(8.0).mul_(_half(tile, 0))


def _decode_q4_1(tile: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(_nibble_codes(tile, 4))
    out.mul_(_half(tile, 0)).add_(_half(tile, 2))


def _five_bit_codes(tile: torch.Tensor, qh_at: int, qs_at: int) -> torch.Tensor:
    """Q5_0/Q5_1 codes 0..31 as uint8 ``[R, B, 32]``: nibbles at ``qs_at``, fifth bits (u32) at ``qh_at``."""
    codes = _nibble_codes(tile, qs_at)
    # Bit j of the little-endian u32 is bit j % 8 of byte j // 8: element j's fifth bit.
    codes |= _fifth_bits(tile[..., qh_at : qh_at + 4]).view(tile.shape[0], tile.shape[1], 32)
    return codes


def _decode_q5_0(tile: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(_five_bit_codes(tile, 2, 6))
    out.sub_(16.0).mul_(_half(tile, 0))


def _decode_q5_1(tile: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(_five_bit_codes(tile, 4, 8))
    out.mul_(_half(tile, 0)).add_(_half(tile, 2))


def _decode_q2_k(tile: torch.Tensor, out: torch.Tensor) -> None:
    """Q2_K (256, 84): scales[16] @0 (low nibble scale, high nibble min), qs[64] @16, d @80, dmin @82."""
    rows, blocks = tile.shape[0], tile.shape[1]
    scales = tile[..., 0:16]
    d_scale = (_half(tile, 80) * (scales & 0x0F).to(_F32)).unsqueeze(-1)
    d_min = (_half(tile, 82) * (scales >> 4).to(_F32)).unsqueeze(-1)
    # element 128c + 32s + l: bits 2s..2s+1 of byte 32c + l
    codes = _unpack(tile[..., 16:80].reshape(rows, blocks, 2, 32), _CRUMBS, 3)
    out.copy_(codes.view(rows, blocks, 256))
    sub = out.view(rows, blocks, 16, 16)
    sub.mul_(d_scale).sub_(d_min)


def _decode_q3_k(tile: torch.Tensor, out: torch.Tensor) -> None:
    """Q3_K (256, 110): hmask[32] @0, qs[64] @32, 6-bit signed scales (12 bytes) @96, d @108."""
    rows, blocks = tile.shape[0], tile.shape[1]
    low = _unpack(tile[..., 96:104], _NIBBLES, 0x0F).view(rows, blocks, 16)
    high = _unpack(tile[..., 104:108], _CRUMBS, 3).view(rows, blocks, 16)
    scale = (low | (high << 4)).to(torch.int8) - 32
    d_scale = (_half(tile, 108) * scale.to(_F32)).unsqueeze(-1)
    codes = _unpack(tile[..., 32:96].reshape(rows, blocks, 2, 32), _CRUMBS, 3).view(rows, blocks, 8, 32)
    mask = _unpack(tile[..., 0:32], _BITS, 1)
    # The high bit is inverted: a clear hmask bit subtracts 4 (q = low - 4 * (1 - bit), in -4..3).
    mask ^= 1
    mask <<= 2
    signed = codes.view(torch.int8)
    signed -= mask.view(torch.int8)
    out.view(rows, blocks, 8, 32).copy_(signed)
    out.view(rows, blocks, 16, 16).mul_(d_scale)


def _scale_min_k4(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 sub-block (scale, min) 6-bit pairs of a Q4_K/Q5_K block from its 12 bytes, as float32."""
    d_bytes, m_bytes, md_bytes = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scale = torch.cat([d_bytes & 0x3F, (md_bytes & 0x0F) | ((d_bytes >> 2) & 0x30)], dim=-1)
    minimum = torch.cat([m_bytes & 0x3F, (md_bytes >> 4) | ((m_bytes >> 2) & 0x30)], dim=-1)
    return scale.to(_F32), minimum.to(_F32)


def _decode_k4(tile: torch.Tensor, out: torch.Tensor, *, five_bit: bool) -> None:
    """Q4_K (256, 144) / Q5_K (256, 176): ``(d*sc)*q - (dmin*m)`` per 32-element sub-block."""
    rows, blocks = tile.shape[0], tile.shape[1]
    scale, minimum = _scale_min_k4(tile[..., 4:16])
    d_scale = (_half(tile, 0) * scale).unsqueeze(-1)
    d_min = (_half(tile, 2) * minimum).unsqueeze(-1)
    nib_at = 48 if five_bit else 16
    # chunk c of 32 bytes: sub-block 2c in the low nibbles, 2c + 1 in the high nibbles
    codes = _unpack(tile[..., nib_at : nib_at + 128].reshape(rows, blocks, 4, 32), _NIBBLES, 0x0F)
    codes = codes.view(rows, blocks, 8, 32)
    if five_bit:
        # bit s of qh byte l is the fifth bit of lane l of sub-block s
        high = _unpack(tile[..., 16:48], _BITS, 1)
        high <<= 4
        codes |= high
    view = out.view(rows, blocks, 8, 32)
    view.copy_(codes)
    view.mul_(d_scale).sub_(d_min)


def _decode_q4_k(tile: torch.Tensor, out: torch.Tensor) -> None:
    _decode_k4(tile, out, five_bit=False)


def _decode_q5_k(tile: torch.Tensor, out: torch.Tensor) -> None:
    _decode_k4(tile, out, five_bit=True)


def _decode_q6_k(tile: torch.Tensor, out: torch.Tensor) -> None:
    """Q6_K (256, 210): ql[128] @0, qh[64] @128, int8 scales[16] @192, d @208; ``(d*sc)*(q - 32)``."""
    rows, blocks = tile.shape[0], tile.shape[1]
    d_scale = (_half(tile, 208) * tile[..., 192:208].view(torch.int8).to(_F32)).unsqueeze(-1)
    # half h, element 64t + i (t < 2: low nibble, t >= 2: high) of ql[64h + i % 64]; bits 2t of qh[32h + l]
    codes = _unpack(tile[..., 0:128].reshape(rows, blocks, 2, 64), _NIBBLES, 0x0F).view(rows, blocks, 256)
    high = _unpack(tile[..., 128:192].reshape(rows, blocks, 2, 32), _CRUMBS, 3).view(rows, blocks, 256)
    high <<= 4
    codes |= high
    out.copy_(codes)
    out.sub_(32.0)
    out.view(rows, blocks, 16, 16).mul_(d_scale)


def _decode_f32(tile: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(tile.view(_F32))


def _decode_f16(tile: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(tile.view(torch.float16))


def _decode_bf16(tile: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(tile.view(torch.bfloat16))


#: The types decoded by the torch tile decoders above.
_NATIVE: dict[str, TileDecoder] = {
    "F32": _decode_f32,
    "F16": _decode_f16,
    "BF16": _decode_bf16,
    "Q8_0": _decode_q8_0,
    "Q4_0": _decode_q4_0,
    "Q4_1": _decode_q4_1,
    "Q5_0": _decode_q5_0,
    "Q5_1": _decode_q5_1,
    "Q2_K": _decode_q2_k,
    "Q3_K": _decode_q3_k,
    "Q4_K": _decode_q4_k,
    "Q5_K": _decode_q5_k,
    "Q6_K": _decode_q6_k,
}

#: The type lists live in :mod:`.gguf_types` (torch-free: the kernel's capability is read at push);
#: ``_NATIVE`` names exactly :data:`NATIVE_TYPES` (tests/kernels/test_gguf_types.py checks it).

#: Bound on each torch decoder's temporaries, as a multiple of the float32 tile's bytes (measured
#: resident high-water mark on a 1024 x 4096 tile plus 0.1, rounded: uint8 code planes, int32 lookup
#: indices and block-sized scale columns).
_SCRATCH_NATIVE = {
    "F32": 0.05, "F16": 0.05, "BF16": 0.05, "Q8_0": 0.05, "Q4_0": 0.35, "Q4_1": 0.35, "Q5_0": 0.85,
    "Q5_1": 0.85, "Q2_K": 0.6, "Q3_K": 0.85, "Q4_K": 0.6, "Q5_K": 0.8, "Q6_K": 0.75,
}  # fmt: skip
#: gguf.quants decoders run on chunks of about this many elements; their temporaries (output
#: included) peak at <= 3.3x the chunk's float32 bytes (tracemalloc, every type), bounded here by 4x.
_GGUF_CHUNK_ELEMENTS = 1 << 17
_SCRATCH_GGUF_CHUNKS = 4.0


def _gguf_chunk_rows(k: int) -> int:
    return max(1, _GGUF_CHUNK_ELEMENTS // k)


def _is_count(value: object) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def block_geometry(ggml_type: str, tensor: str = "gguf weight") -> tuple[int, int]:
    """``(elements per block, bytes per block)`` of a handled type; refuses any other."""
    if not isinstance(ggml_type, str) or ggml_type not in GGUF_DIRECT_TYPES:
        raise UnknownGgmlTypeError(
            tensor,
            "ggml_type",
            f"one of {sorted(GGUF_DIRECT_TYPES)}",
            repr(ggml_type),
            "no direct block decoder exists for this type; another kernel (or full dequant) must run it",
        )
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]]
    return int(block), int(type_size)


def row_bytes_for(ggml_type: str, k: int, tensor: str = "gguf weight") -> int:
    """Bytes of one row of ``k`` elements of ``ggml_type``; ``k`` must be a positive number of blocks."""
    block, type_size = block_geometry(ggml_type, tensor)
    if not _is_count(k) or k <= 0 or k % block:
        raise BlockAlignmentError(
            tensor,
            "K",
            f"a positive multiple of the {ggml_type} block size {block}",
            k,
            "a rank's K slice must cover whole GGUF blocks; split K on block boundaries",
        )
    return k // block * type_size


def k_slice_bytes(ggml_type: str, k_start: int, k_local: int, tensor: str = "gguf weight") -> slice:
    """The byte columns of a row holding elements ``[k_start, k_start + k_local)``.

    A rank's K slice of a GGUF weight must start and end on block boundaries (bytes cut inside a block
    would still have a plausible length but decode as garbage); anything else is refused.
    """
    block, type_size = block_geometry(ggml_type, tensor)
    if not _is_count(k_start) or k_start < 0 or k_start % block:
        raise BlockAlignmentError(
            tensor,
            "K slice start",
            f"a non-negative multiple of the {ggml_type} block size {block}",
            k_start,
            "split K between ranks on whole GGUF blocks",
        )
    width = row_bytes_for(ggml_type, k_local, tensor)
    first = k_start // block * type_size
    return slice(first, first + width)


def workspace_bytes(ggml_type: str, k: int, tile_rows: int) -> int:
    """Peak extra bytes one :func:`gguf_block_matmul` call needs beyond its operands and result.

    The float32 tile ``tile_rows x K`` plus the decoder's temporaries (a bound, see ``_SCRATCH_*``);
    independent of N. The uint8 block plane is used in place.
    """
    row_bytes_for(ggml_type, k)
    _check_tile_rows(tile_rows)
    tile = tile_rows * k * 4
    if ggml_type in _SCRATCH_NATIVE:
        return tile + int(tile * _SCRATCH_NATIVE[ggml_type])
    chunk = min(tile_rows, _gguf_chunk_rows(k)) * k * 4
    return tile + int(chunk * _SCRATCH_GGUF_CHUNKS)


def _check_tile_rows(tile_rows: int, tensor: str = "gguf weight") -> None:
    if not _is_count(tile_rows) or tile_rows <= 0:
        raise WorkspaceError(tensor, "tile_rows", "a positive int", repr(tile_rows), "pass e.g. 256")


def _check_blocks(blocks: object, ggml_type: str, k: int, tensor: str) -> npt.NDArray[np.uint8]:
    """Validate the block plane; returns it typed. Checked before anything is allocated."""
    per_row = row_bytes_for(ggml_type, k, tensor)
    if not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint8:
        found = f"numpy {blocks.dtype}" if isinstance(blocks, np.ndarray) else type(blocks).__name__
        raise BlockDtypeError(
            tensor, "blocks", "a uint8 numpy array of raw GGUF block bytes", found,
            "pass the loader's block plane as it is (uint8 [rows, row_bytes]), not decoded values",
        )  # fmt: skip
    if blocks.ndim != 2 or blocks.shape[1] != per_row:
        block, type_size = block_geometry(ggml_type, tensor)
        raise RowBytesError(
            tensor,
            "blocks shape",
            f"[N, {per_row}] (= K {k} / {block} * {type_size} bytes of {ggml_type})",
            list(blocks.shape),
            "the GGUF type or K does not match the bytes; check the rank's K slice and the tensor type",
        )
    if not blocks.flags.c_contiguous:
        raise NonContiguousBlocksError(
            tensor, "blocks layout", "C-contiguous rows", f"strides {blocks.strides}",
            "slice ranks on whole rows, or copy the columns the rank owns into a contiguous plane",
        )  # fmt: skip
    return blocks


def _check_x(x: object, k: int, tensor: str) -> torch.Tensor:
    """Validate the activation; returns it as float32 (widened if bfloat16/float16)."""
    accepted = (torch.float32, torch.bfloat16, torch.float16)
    if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.dtype not in accepted or x.device.type != "cpu":
        found = (
            f"{x.dtype} {list(x.shape)} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
        )
        raise ActivationError(
            tensor, "x", "a 2-D [T, K] float32/bfloat16/float16 CPU tensor", found,
            "flatten leading dimensions to T and pass the activation on the CPU",
        )  # fmt: skip
    if x.shape[1] != k:
        raise ActivationError(
            tensor, "x columns", f"K = {k}", x.shape[1], "the activation's K must equal the weight's K slice"
        )
    return x.to(_F32).contiguous()


def _torch_view(blocks: npt.NDArray[np.uint8]) -> torch.Tensor:
    """A zero-copy torch view of the block plane (read-only planes included; never written)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
        return torch.from_numpy(blocks)


def _decode_into(
    ggml_type: str, tile: torch.Tensor, raw: npt.NDArray[np.uint8], out: torch.Tensor, block: int
) -> None:
    """Decode one tile of rows (``tile``: torch view, ``raw``: numpy view of the same bytes) into ``out``."""
    rows = tile.shape[0]
    native = _NATIVE.get(ggml_type)
    if native is not None:
        blocks_per_row = out.shape[1] // block
        native(tile.view(rows, blocks_per_row, -1), out.view(rows, blocks_per_row, block))
        return
    # gguf's numpy decoders are fastest (cache-resident) and hold least on small chunks of rows.
    step = _gguf_chunk_rows(out.shape[1])
    qtype = GGMLQuantizationType[ggml_type]
    for start in range(0, rows, step):
        values = _gguf_dequantize(raw[start : start + step], qtype)
        out[start : start + step].copy_(torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)))


def gguf_block_matmul(
    x: torch.Tensor,
    blocks: np.ndarray,
    ggml_type: str,
    k: int,
    *,
    tile_rows: int = 256,
    tensor: str = "gguf weight",
) -> torch.Tensor:
    """``x @ W.T`` as float32 ``[T, N]``, decoding W from its raw GGUF blocks one tile of rows at a time.

    ``x`` is ``[T, K]`` (float32, bfloat16 or float16; computed in float32); ``blocks`` is the rank's
    uint8 ``[N, K / block * type_size]`` plane exactly as loaded; ``k`` is the rank-local K (whole
    blocks). Extra memory is :func:`workspace_bytes` (one ``tile_rows x K`` float32 tile, reused),
    never a float copy of W. ``tensor`` names the weight in errors. Raises a
    :class:`~.gguf_errors.KernelInputError` subclass for a bad type, K, plane or activation.
    """
    plane = _check_blocks(blocks, ggml_type, k, tensor)
    _check_tile_rows(tile_rows, tensor)
    x32 = _check_x(x, k, tensor)
    block, _ = block_geometry(ggml_type)
    n = plane.shape[0]
    out_t = torch.empty(n, x32.shape[0], dtype=_F32)  # rows of y.T: each tile writes a contiguous slab
    if n and x32.shape[0]:
        with torch.no_grad():  # an inference kernel: out= products take no autograd
            _tiled_matmul(x32, plane, ggml_type, block, tile_rows, out_t)
    return out_t.t().contiguous()


def _tiled_matmul(
    x32: torch.Tensor,
    plane: npt.NDArray[np.uint8],
    ggml_type: str,
    block: int,
    tile_rows: int,
    out_t: torch.Tensor,
) -> None:
    """``out_t[rows] = W[rows] @ x.T``, one tile of rows at a time through one reused workspace."""
    n, k = plane.shape[0], x32.shape[1]
    view = _torch_view(plane)
    workspace = torch.empty(min(tile_rows, n), k, dtype=_F32)
    x_t = x32.t()
    for start in range(0, n, tile_rows):
        stop = min(start + tile_rows, n)
        w = workspace[: stop - start]
        _decode_into(ggml_type, view[start:stop], plane[start:stop], w, block)
        torch.mm(w, x_t, out=out_t[start:stop])


def gguf_block_decode(
    blocks: np.ndarray, ggml_type: str, k: int, *, tensor: str = "gguf weight"
) -> torch.Tensor:
    """Decode a (small) block plane to float32 ``[N, K]`` with the kernel's own tile decoders.

    For proofs (the kernel layout's decode vs the reference decoder), not for serving: it does
    allocate the full float copy the matmul avoids.
    """
    plane = _check_blocks(blocks, ggml_type, k, tensor)
    block, _ = block_geometry(ggml_type)
    out = torch.empty(plane.shape[0], k, dtype=_F32)
    if plane.shape[0]:
        _decode_into(ggml_type, _torch_view(plane), plane, out, block)
    return out
