"""Float formats: reading planes as typed arrays, widening to binary32, and rounding to narrow formats.

Everything is exact bit manipulation in numpy; nothing depends on the host's byte order (planes are
little-endian, as in safetensors and GGUF).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shardport.registry.formats.elements import DTYPE_BYTES, ELEMENTS

from .errors import PlaneShapeError, PlaneSizeError, UnsupportedContractError

#: Little-endian numpy dtype for each physical dtype. BF16 and the 8-bit floats are read as raw bits.
_NUMPY_DTYPE: dict[str, str] = {
    e.name: e.numpy for e in ELEMENTS.values() if e.numpy is not None and e.name in DTYPE_BYTES
}

F32 = npt.NDArray[np.float32]


def as_plane(
    array: npt.NDArray[np.generic], dtype: str, shape: tuple[int, ...], tensor: str
) -> npt.NDArray[np.generic]:
    """Return ``array`` viewed as the physical ``dtype`` and ``shape``.

    Accepts the typed array itself, raw bytes (any 1-byte dtype, e.g. ``uint8`` from a range read), or
    integers of the same width with the other signedness (``int16``/``uint16`` for BF16 bits). Raises
    :class:`PlaneShapeError` for an unknown or different dtype (e.g. fp32 values for an fp16 plane) and
    :class:`PlaneSizeError` when the byte count is not ``prod(shape) * itemsize``.
    """
    if dtype not in _NUMPY_DTYPE:
        raise PlaneShapeError(tensor, "physical_dtype", f"one of {sorted(_NUMPY_DTYPE)}", dtype)
    expected_bytes = DTYPE_BYTES[dtype]
    for extent in shape:
        expected_bytes *= extent
    data = np.ascontiguousarray(array)
    wanted = np.dtype(_NUMPY_DTYPE[dtype])
    same_width_ints = (
        data.dtype.kind in "iu" and wanted.kind in "iu" and data.dtype.itemsize == wanted.itemsize
    )
    if not (data.dtype == wanted or data.dtype.itemsize == 1 or same_width_ints):
        raise PlaneShapeError(
            tensor, "dtype", f"{dtype} values or raw bytes", f"{data.dtype} {list(data.shape)}"
        )
    if data.nbytes != expected_bytes:
        raise PlaneSizeError(
            tensor,
            "bytes",
            f"{expected_bytes} (= {dtype} * {list(shape)})",
            f"{data.nbytes} ({data.dtype} {list(data.shape)})",
            "the plane is truncated or padded; re-fetch it or fix the contract's physical shape",
        )
    return data.reshape(-1).view(np.uint8).view(np.dtype(_NUMPY_DTYPE[dtype])).reshape(shape)


def bf16_bits_to_f32(bits: npt.NDArray[np.generic]) -> F32:
    """Widen bfloat16 bit patterns (any 16-bit integer array) to binary32, exactly."""
    return (bits.astype(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def e8m0_bits_to_f32(bits: npt.NDArray[np.generic]) -> F32:
    """Widen E8M0 (power-of-two exponent, bias 127, 0xFF = NaN) to binary32, exactly."""
    raw = bits.astype(np.uint32)
    # Exponent byte e is 2**(e - 127); e = 0 is 2**-127, a binary32 subnormal (bit 22).
    out = np.where(raw == 0, np.uint32(0x00400000), raw << np.uint32(23)).astype(np.uint32)
    out = np.where(raw == 0xFF, np.uint32(0x7FC00000), out).astype(np.uint32)
    return out.view(np.float32)


def e4m3_bits_to_f32(bits: npt.NDArray[np.generic]) -> F32:
    """Widen OCP E4M3 (``e4m3fn``: bias 7, no infinities, S.1111.111 = NaN) to binary32, exactly."""
    raw = bits.astype(np.int64)
    sign = np.where(raw & 0x80, -1.0, 1.0)
    exponent = (raw >> 3) & 0xF
    mantissa = raw & 0x7
    normal = (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
    subnormal = (mantissa / 8.0) * np.exp2(-6.0)
    value = sign * np.where(exponent == 0, subnormal, normal)
    value = np.where((raw & 0x7F) == 0x7F, np.nan, value)
    return value.astype(np.float32)


def e5m2_bits_to_f32(bits: npt.NDArray[np.generic]) -> F32:
    """Widen OCP E5M2 (the top byte of a binary16; infinities and NaNs kept) to binary32, exactly."""
    return (bits.astype(np.uint16) << np.uint16(8)).view(np.float16).astype(np.float32)


def scale_to_f32(plane: npt.NDArray[np.generic], fmt: str, tensor: str) -> F32:
    """Widen a scale (or float) plane, already typed by :func:`as_plane`, from ``fmt`` to binary32."""
    if fmt == "binary32":
        return plane.astype(np.float32)
    if fmt == "binary16":
        return (
            plane.view(np.float16).astype(np.float32)
            if plane.dtype.itemsize == 2
            else plane.astype(np.float32)
        )
    if fmt == "bfloat16":
        return bf16_bits_to_f32(plane)
    if fmt == "e8m0":
        return e8m0_bits_to_f32(plane)
    if fmt == "e4m3":
        return e4m3_bits_to_f32(plane)
    if fmt == "e5m2":
        return e5m2_bits_to_f32(plane)
    raise UnsupportedContractError(tensor, "scales.format", "binary32|binary16|bfloat16|e8m0|e4m3|e5m2", fmt)


def round_to_format(values: F32, fmt: str) -> F32:
    """Round binary32 values to ``fmt`` (round to nearest, ties to even) and widen back to binary32."""
    if fmt == "binary32":
        return values
    if fmt == "binary16":
        return values.astype(np.float16).astype(np.float32)
    if fmt == "bfloat16":
        bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
        is_nan = np.isnan(values)
        rounded = np.where(is_nan, (bits >> np.uint64(16)) | np.uint64(0x40), rounded)
        return bf16_bits_to_f32(rounded.astype(np.uint16))
    raise ValueError(f"cannot round to {fmt}")
