"""The int4pack form of a rank's weight: codes ``u`` in 0..15, (scale, zero) per group, the decode law.

:func:`int4_terms` builds it at load time for the packed int4 kernels (CPU and CUDA). Two ways to
the same codes, scales and zeros:

- fast (the load path): 4-bit codes in 32-bit words (GPTQ, AWQ, compressed-tensors int4) and GGUF
  Q4_0/Q4_1 nibbles are split with byte-wide masks and shifts into one byte-per-code ``[N, K]`` array
  in one pass (no int64 intermediate; held as int8 so that ``u - 8`` stays signed). The encoding is
  applied through its table over the 16 field values (the registry's own ``apply_encoding``), so every
  code lies in 0..15 by construction. Zero points and scales come from the registry
  (:func:`affine_qparams`) without unpacking the codes a second time.
- oracle (``fast=False``; parity L1 compares against it): the registry's generic per-field unpacking
  (:func:`affine_terms`), int64 codes, range-checked element by element.

An element's value, in the layout and under the decode law, depends only on its group's parameters
and its code: :attr:`Int4Form.reference_table` is the decode law over the 16 codes of every group, and
:func:`table_error` takes a layout's largest error over that table, restricted to the codes each
group actually holds -- the same number as comparing every element, at a fraction of the work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardport.registry.contracts.decode import affine_qparams, affine_terms, decode_weight
from shardport.registry.contracts.encodings import encoding_value_range
from shardport.registry.contracts.formats import round_to_format
from shardport.registry.contracts.gguf_blocks import as_gguf_rows, decode_gguf_rows
from shardport.registry.contracts.model import (
    AffineIntContract,
    GgufBlockContract,
    GroupMapNone,
    LogicalShape,
    PermutationPlane,
)
from shardport.registry.contracts.packing import apply_encoding

from .errors import KernelInputError
from .prepared import F32, ROW_CHUNK
from .weight import RankWeight

F64 = npt.NDArray[np.float64]
U8 = npt.NDArray[np.uint8]
Codes = npt.NDArray[np.integer[Any]]
I64 = npt.NDArray[np.int64]
#: ``(rows, groups) → [len, 16]``: the value of each code 0..15 in group ``groups[i]`` of row ``rows[i]``.
Table = Callable[[I64, I64], npt.NDArray[np.floating[Any]]]

_SIXTEEN = np.arange(16, dtype=np.int64)
_SHIFTS = np.arange(16, dtype=np.uint16)
#: Q4_0/Q4_1 qs byte ``j`` = ``j | j << 4``: elements ``j`` and ``16 + j`` of a block both hold code ``j``.
_EVERY_CODE = (np.arange(16, dtype=np.uint8) * np.uint8(17)).astype(np.uint8)


@dataclass(frozen=True)
class Int4Form:
    """A rank's weight in int4pack's terms.

    ``u [N, K]``: codes in 0..15 (int8 from the fast path, int64 from the oracle); ``scale``/``zero``
    ``[G, N]`` (float64, exact) with ``w = (u - 8)·scale + zero``; ``group``: the group size;
    ``reference_rows``: the decode law's rows (binary32); ``reference_table``: the decode law over the
    16 codes of any groups (binary32; None where a column's group is not ``k // group``, e.g. an
    act-order g_idx); ``group_keys``: ``[N, G]`` integers equal only where two groups' parameters
    (hence every value of both tables) are equal -- the block header for Q4_0 -- or None.
    """

    u: Codes
    scale: F64
    zero: F64
    group: int
    reference_rows: Callable[[int, int], F32]
    reference_table: Table | None = None
    group_keys: npt.NDArray[np.uint16] | None = None


def _fields_u8(c: AffineIntContract, plane: npt.NDArray[Any], n: int, k: int) -> U8 | None:
    """The stored 4-bit fields ``[N, K]`` (uint8) of 32-bit slot/bitstream words; None if not that form.

    Slot ``i`` (bits ``4i..4i+3`` from the LSB) holds run element ``slot_order[i]``: the low nibble of
    the word's little-endian byte ``i // 2`` for even ``i``, its high nibble for odd ``i``. A 4-bit
    bitstream in 32-bit containers is the identity slot order.
    """
    codes, pack = c.codes, c.codes.packing
    if (
        codes.bits != 4
        or pack.container_bits != 32
        or pack.axis not in ("N", "K")
        or pack.bit_order != "lsb_first"
    ):
        return None
    if plane.ndim != 2 or plane.dtype.itemsize != 4 or plane.dtype.kind not in "iu":
        return None
    if not np.little_endian or plane.dtype.byteorder == ">":
        return None
    along = n if pack.axis == "N" else k
    other = k if pack.axis == "N" else n
    words = plane if codes.physical_axes[-1] == pack.axis else plane.T  # [other, words along the pack axis]
    if along % 8 or words.shape != (other, along // 8):
        return None
    data = np.ascontiguousarray(words).view(np.uint8).reshape(other, along // 8, 4)
    order = tuple(pack.slot_order) if pack.scheme == "slots" else tuple(range(8))
    if pack.axis == "K":
        return _split(data, order).reshape(n, k)
    out = np.empty((n, k), dtype=np.uint8)  # fields run along N: transpose a block of rows at a time
    for r in range(0, n, ROW_CHUNK):
        stop = min(r + ROW_CHUNK, n)
        out[r:stop] = _split(data[:, r // 8 : stop // 8], order).reshape(k, stop - r).T
    return out


def _split(data: U8, order: tuple[int, ...]) -> U8:
    """Words as little-endian bytes ``[lines, W, 4]`` → their eight 4-bit fields ``[lines, W, 8]``."""
    lines, width = data.shape[0], data.shape[1]
    fields = np.empty((lines, width, 8), dtype=np.uint8)
    if order == tuple(range(8)):
        pairs = fields.reshape(lines, width, 4, 2)
        np.bitwise_and(data, np.uint8(0x0F), out=pairs[..., 0])
        np.right_shift(data, np.uint8(4), out=pairs[..., 1])
        return fields
    for slot, element in enumerate(order):
        byte = data[:, :, slot // 2]
        if slot % 2:
            np.right_shift(byte, np.uint8(4), out=fields[:, :, element])
        else:
            np.bitwise_and(byte, np.uint8(0x0F), out=fields[:, :, element])
    return fields


def _encoded(stored: U8, encoding: str) -> U8 | None:
    """``u = q - lo`` of every stored field, through the encoding's table; None if a code leaves 0..15."""
    table = apply_encoding(_SIXTEEN, encoding, 4, packed=True) - encoding_value_range(encoding)[0]
    if table.min() < 0 or table.max() > 15:
        return None  # the oracle path finds and names the offending element
    if np.array_equal(table, _SIXTEEN):
        return stored
    if np.array_equal(table, _SIXTEEN ^ 8):  # two's complement: u = field ^ 8, in place
        np.bitwise_xor(stored, np.uint8(8), out=stored)
        return stored
    encoded: U8 = table.astype(np.uint8)[stored]
    return encoded


def _affine_table(c: AffineIntContract, zero: npt.NDArray[Any], scale: F32, lo: int) -> Table:
    """The decode law (as :func:`decode_affine` evaluates it) over the 16 codes of the given groups."""
    q = _SIXTEEN + lo

    def table(rows: I64, groups: I64) -> F32:
        z = zero[rows, groups][:, None]
        if z.dtype == np.int64:
            diff = (q - z).astype(np.float32)
        else:
            diff = q.astype(np.float32) - z.astype(np.float32)
        values: F32 = diff * scale[rows, groups][:, None]
        if c.decode_law == "affine_round_to_scale_format":
            values = round_to_format(values, c.scales.format)
        return values

    return table


def _affine_rows(
    c: AffineIntContract, q_rows: Callable[[int, int], Codes], zero: Any, scale: F32, group: Any
) -> Callable[[int, int], F32]:
    def reference_rows(start: int, stop: int) -> F32:  # the decode law, as decode_affine evaluates it
        q, z = q_rows(start, stop), zero[start:stop][:, group]
        if z.dtype == np.int64:
            diff = (q - z).astype(np.float32)
        else:
            diff = q.astype(np.float32) - z.astype(np.float32)
        values: F32 = diff * scale[start:stop][:, group]
        if c.decode_law == "affine_round_to_scale_format":
            values = round_to_format(values, c.scales.format)
        return values

    return reference_rows


def _affine_form(
    c: AffineIntContract,
    u: Codes,
    zero: npt.NDArray[Any],
    scale: F32,
    group: npt.NDArray[np.int64],
    q_rows: Callable[[int, int], Codes],
) -> Int4Form:
    lo = encoding_value_range(c.codes.encoding)[0]
    s = scale.astype(np.float64)
    z = zero.astype(np.float64)
    size = c.scales.group_size
    sequential = group.size == u.shape[1] and np.array_equal(group, np.arange(u.shape[1]) // size)
    return Int4Form(
        u,
        s.T.copy(),
        (s * (8.0 + lo - z)).T.copy(),
        size,
        _affine_rows(c, q_rows, zero, scale, group),
        _affine_table(c, zero, scale, lo) if sequential else None,
    )


def _affine_fast(c: AffineIntContract, weight: RankWeight) -> Int4Form | None:
    """GPTQ / AWQ / compressed-tensors int4 in 32-bit words: int8 codes; None if not that form."""
    if not isinstance(c.group_map, GroupMapNone) or isinstance(c.permutation, PermutationPlane):
        return None
    planes = weight.named_planes
    shape = LogicalShape(axes=("N", "K"), extents=(weight.n_local, weight.k_local))
    zero, scale, group = affine_qparams(c, planes, shape, weight.where)  # checks every plane's shape
    stored = _fields_u8(c, planes[c.codes.plane], weight.n_local, weight.k_local)
    encoded = None if stored is None else _encoded(stored, c.codes.encoding)
    if encoded is None:
        return None
    u = encoded.view(np.int8)
    lo = encoding_value_range(c.codes.encoding)[0]

    def q_rows(start: int, stop: int) -> Codes:
        return u[start:stop].astype(np.int64) + lo

    return _affine_form(c, u, zero, scale, group, q_rows)


def _affine_oracle(c: AffineIntContract, weight: RankWeight) -> Int4Form:
    """Any affine int4 contract via the registry's generic :func:`affine_terms` (int64 codes)."""
    shape = LogicalShape(axes=("N", "K"), extents=(weight.n_local, weight.k_local))
    terms = affine_terms(c, weight.named_planes, shape, None, weight.where)
    lo = encoding_value_range(c.codes.encoding)[0]

    def q_rows(start: int, stop: int) -> Codes:
        return terms.q[start:stop]

    return _affine_form(c, terms.q - lo, terms.zero, terms.scale, terms.group, q_rows)


def _gguf_q4(c: GgufBlockContract, weight: RankWeight, *, fast: bool) -> Int4Form:
    """Q4_0 / Q4_1 blocks: ``u`` the nibbles, ``scale = d``, ``zero = 0`` or ``m + 8d``."""
    n, k = weight.n_local, weight.k_local
    head = 2 if c.ggml_type == "Q4_0" else 4
    rows = as_gguf_rows(weight.planes["codes"], c.ggml_type, n, k, c.plane)
    blocks = rows.reshape(n, k // 32, head + 16)
    d_bits = np.ascontiguousarray(blocks[:, :, 0:2]).view("<u2")[..., 0]  # [N, G]
    d = d_bits.view("<f2").astype(np.float64)
    qs = blocks[:, :, head:]
    u: Codes
    if fast:  # element j < 16 of a block: low nibble of byte j; 16 + j: its high nibble
        nibbles = np.empty((n, k // 32, 2, 16), dtype=np.uint8)
        np.bitwise_and(qs, np.uint8(0x0F), out=nibbles[:, :, 0])
        np.right_shift(qs, np.uint8(4), out=nibbles[:, :, 1])
        u = nibbles.reshape(n, k).view(np.int8)
    else:
        u = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, k).astype(np.int64)
    if c.ggml_type == "Q4_0":
        zero = np.zeros_like(d)
    else:
        m = np.ascontiguousarray(blocks[:, :, 2:4]).view("<f2")[..., 0].astype(np.float64)
        zero = m + 8.0 * d
    local = weight.local_weight

    def reference_rows(start: int, stop: int) -> F32:
        return decode_weight(local, weight.named_planes, range(start, stop))

    def reference_table(at_rows: I64, groups: I64) -> F32:
        """The registry's own decoder on blocks with those groups' headers holding every code."""
        synthetic = np.empty((at_rows.size, head + 16), dtype=np.uint8)
        synthetic[:, :head] = blocks[at_rows, groups, :head]
        synthetic[:, head:] = _EVERY_CODE
        values = decode_gguf_rows(c.ggml_type, synthetic, at_rows.size, 32, c.plane)
        table: F32 = values[:, :16]
        return table

    keys = d_bits if c.ggml_type == "Q4_0" else None  # Q4_0's whole header is d
    return Int4Form(u, d.T.copy(), zero.T.copy(), 32, reference_rows, reference_table, keys)


def _checked(weight: RankWeight, form: Int4Form) -> Int4Form:
    """Codes in 0..15 (int4pack does not range-check) and a whole [G, N] scale/zero plane (nor that)."""
    u, scale, zero, group = form.u, form.scale, form.zero, form.group
    if u.size and (int(u.min()) < 0 or int(u.max()) > 15):
        r, k = (int(i) for i in np.argwhere((u < 0) | (u > 15))[0])
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


def int4_terms(weight: RankWeight, *, fast: bool = True) -> Int4Form:
    """The int4pack form of a rank's weight, its codes range-checked and its scale count checked.

    ``fast``: int8 codes from a vectorised nibble split where the codes are 4-bit fields of 32-bit
    words or GGUF Q4_0/Q4_1 blocks (else, and with ``fast=False``, the registry's generic per-field
    unpacking into int64 codes, the oracle the parity ladder uses).
    """
    c = weight.contract
    if isinstance(c, GgufBlockContract):
        form = _gguf_q4(c, weight, fast=fast)
    elif isinstance(c, AffineIntContract):
        fast_form = _affine_fast(c, weight) if fast else None
        form = fast_form if fast_form is not None else _affine_oracle(c, weight)
    else:
        raise KernelInputError(weight.where, "contract family", "affine_int or gguf Q4_0/Q4_1", c.family)
    return _checked(weight, form)


def code_presence(u: Codes, group: int) -> npt.NDArray[np.uint16]:
    """``[rows, G]``: bit ``c`` set where code ``c`` occurs in the group (codes already checked in 0..15)."""
    rows, k = u.shape
    codes = (u.view(np.uint8) if u.dtype == np.int8 else u.astype(np.uint8)).reshape(rows, k // group, group)
    present: npt.NDArray[np.uint16] = np.bitwise_or.reduce(
        np.left_shift(np.uint16(1), codes, dtype=np.uint16), axis=2
    )
    return present


def _representatives(keys: npt.NDArray[np.uint16]) -> tuple[I64, I64]:
    """One flat index per distinct key, and each group's position among the distinct keys."""
    flat = keys.reshape(-1)
    if flat.size <= 1 << 16:  # a sort is cheaper than three 2**16 tables
        _, first, position = np.unique(flat, return_index=True, return_inverse=True)
        return first.astype(np.int64), position.reshape(-1).astype(np.int64)
    where = np.zeros(1 << 16, dtype=np.int64)
    where[flat] = np.arange(flat.size)  # some group holding each key (any one: they are all equal)
    seen = np.zeros(1 << 16, dtype=bool)
    seen[flat] = True
    distinct = np.flatnonzero(seen)
    position = np.zeros(1 << 16, dtype=np.int64)
    position[distinct] = np.arange(distinct.size)
    return where[distinct], position[flat]


def _held(present: npt.NDArray[np.uint16]) -> npt.NDArray[np.bool_]:
    """``[..., 16]``: whether each code is among the groups' codes."""
    held: npt.NDArray[np.bool_] = ((present[..., None] >> _SHIFTS) & 1).astype(bool)
    return held


def table_error(form: Int4Form, layout_table: Table) -> float:
    """Largest ``|W_layout - W_reference|`` over the slice, from the per-group code tables.

    ``layout_table`` gives the layout's value of each code 0..15 of given groups, and
    :attr:`Int4Form.reference_table` the decode law's. Every element equals its group's entry for its
    code, so the maximum over the codes each group holds is the element-wise maximum -- the same
    number; which codes a group holds is read only where some entry differs. With
    :attr:`Int4Form.group_keys`, each distinct key is evaluated once and the codes held by all the
    groups sharing it are OR-ed together. NaN if a difference is NaN.
    """
    table = form.reference_table
    assert table is not None
    n, groups = form.u.shape[0], form.u.shape[1] // form.group
    if form.group_keys is not None:
        first, position = _representatives(form.group_keys)
        at_rows, at_groups = np.divmod(first, groups)
        mine = layout_table(at_rows, at_groups).astype(np.float64)
        diff = np.abs(mine - table(at_rows, at_groups).astype(np.float64))
        if not diff.any():
            return 0.0
        present = code_presence(form.u, form.group).reshape(-1)
        union = np.zeros(first.size, dtype=np.uint16)
        np.bitwise_or.at(union, position, present)
        return float(np.max(diff, where=_held(union), initial=0.0))
    worst = 0.0
    for r in range(0, n, ROW_CHUNK):
        stop = min(r + ROW_CHUNK, n)
        at_rows = np.repeat(np.arange(r, stop, dtype=np.int64), groups)
        at_groups = np.tile(np.arange(groups, dtype=np.int64), stop - r)
        mine = layout_table(at_rows, at_groups).astype(np.float64)
        diff = np.abs(mine - table(at_rows, at_groups).astype(np.float64))
        if not diff.any():  # the layout equals the law on every code of every group here
            continue
        present = code_presence(form.u[r:stop], form.group).reshape(-1)
        part = float(np.max(diff, where=_held(present), initial=0.0))
        if part != part:
            return part
        worst = max(worst, part)
    return worst
