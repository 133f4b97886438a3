"""int4pack's byte map, learnt from torch's own converter at run time: exact code read-back and packing.

The codes are read back without running the kernel, and packed without the converter's scalar loop.

``_convert_weight_to_int4pack_for_cpu`` only moves codes: each nibble of its uint8 ``[N, K/2]`` output
is one code of its int32 ``[N, K]`` input. Which one depends on the ISA torch dispatches to (measured
on torch 2.13: AVX512 puts rows ``d`` and ``d + 32`` of a 64-row block, column ``c``, in byte ``32·c +
d`` of the block; AVX2 does the same within 32-row blocks pairing ``d`` and ``d + 16``; DEFAULT pairs
rows ``2d`` and ``2d + 1``) and is documented nowhere, so it is learnt here, once per process and per
(ISA, K, N % 64), from the converter itself:

- Position probes: ``2·64 + r`` rows by K (``r = N % 64``, the tail rows), where the code at position
  ``p = row·K + col`` is hex digit ``d`` of ``p``. ``⌈log16(positions)⌉`` such probes, packed by the
  converter, spell out for every packed byte the positions its low and high nibbles hold.
- Checks, each refused with :class:`~.errors.ByteMapError` (the caller then reads the codes back
  through the kernel and packs with the converter): the map is a bijection (every position exactly
  once); the bytes of each 64-row block hold only that block's codes and the second block's map is the
  first one's shifted by 64 rows (so one per-block index array applies to every block through a
  reshape); the tail's bytes hold only the tail's codes; on random codes, packing by the map gives the
  converter's bytes and unpacking the converter's bytes gives the codes (the converter moves nibbles and
  does nothing else to them); and the kernel itself reads those bytes as the same codes
  (:func:`kernel_codes`) -- the map is proved against the kernel, on this ISA, for this K, before use.

What could make the map wrong, and what stops it:

- Another ISA (the same bytes mean other codes): a map is keyed by the ISA it was learnt under, and a
  prepared layout refuses to be read under another than the one that packed it (``_check_isa``).
- Another torch build or version with another layout: the map is learnt in this process from this
  torch's converter and checked against this torch's kernel; it is never persisted.
- Blocks past the second packed differently (the map assumes the converter repeats its 64-row block),
  or a layout that depends on N beyond ``N % 64``: map packing is compared with the converter on each
  weight's first and last block (and tail); every sampled L1 also reads every row of 64 spot columns
  (one per K residue of a tile) back through the kernel, whose codes replace the map's there
  (:func:`.parity.level1_by_map`); the full ladder of each class's representative compares the map's
  read-back of the whole weight with the kernel's.

What L1 through the map proves (a preparation packs by the map where it agrees with the converter):
the bytes held now decode, by the layout torch's converter defines, to the codes the registry's generic
unpacking reads from the verified planes -- so the load-time fast unpack, the packing and anything that
touched the packed bytes since are checked on every weight. The map packed those bytes, so on its own
this is the map agreeing with itself; that the kernel reads the layout the same way is proved when the
map is learnt, on every weight's spot columns (every block), and on each class's full ladder.

Applying a map: ``[N, K]`` is ``N // 64`` blocks of ``64·K`` codes plus the tail, each block handled
alike through a per-block plan (no index array as large as the weight, no Python loop over bytes).
Every layout measured is a :class:`Transpose` -- pair the two codes of each byte in one contiguous
pass (eight codes per int64 operation), then a matrix transpose done in two steps, bytes gathered
into 8-byte words over a short stride and the words transposed -- found from the learnt arrays and
checked against them element by element; a map that is not one is applied by ``np.take`` gathers with
the per-block index arrays, a few blocks at a time. Both ways are compared with the converter when a
map is learnt.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from .device import cpu_isa
from .errors import ByteMapError

U8 = npt.NDArray[np.uint8]
I8 = npt.NDArray[np.int8]
#: Per-block index arrays: int32 (a block holds 64·K < 2**31 codes), half the memory of intp.
Index = npt.NDArray[np.int32]

#: Rows of int4pack's widest N block (AVX512); AVX2's and DEFAULT's 32-row blocks tile it.
BLOCK_ROWS = 64
#: The group size the kernel read-back runs at (every K int4pack takes is a multiple of it).
PROBE_GROUP = 32
#: Blocks packed or unpacked at a time: the workspace (paired plane, staged words, nibbles) stays within
#: a few ``CHUNK_BLOCKS · 64 · K`` bytes, about the converter path's ``PACK_ROWS · K · 4`` int32 buffer.
CHUNK_BLOCKS = 16
#: Columns read back per kernel call in :func:`kernel_codes` (two per activation row).
PROBE_COLUMNS = 2048


def _word_dtype(w: int) -> Any:
    """The torch integer dtype of a ``w``-byte word."""
    import torch

    return {2: torch.int16, 4: torch.int32, 8: torch.int64}[w]


#: The low nibble of each of eight bytes (a positive int64).
_LOW_NIBBLES = 0x0F0F0F0F0F0F0F0F


@dataclass(frozen=True, slots=True)
class Transpose:
    """A block's byte map as a pairing and a transpose (every ISA's layout measured here is one).

    Each byte's high nibble is the code ``delta`` positions after its low one, and the low nibbles are
    the positions ``p`` with ``(p // delta)`` even; so the codes pair up as ``v = u[p] | u[p + delta] << 4``
    in one contiguous pass (the *paired plane*, ``rows·k/2`` bytes), and the packed bytes are that plane
    read as an array of shape ``dims`` with element ``strides`` (``torch.as_strided``): byte ``j``, the
    mixed-radix number ``(i_1, ..., i_m)`` over ``dims``, is ``v[Σ i_t·strides_t]``.
    """

    delta: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]

    def pack(self, u: Any, out: Any) -> None:
        """Blocks' codes (torch uint8 ``[B, rows·k]``) → their bytes, written to ``out [B, rows·k/2]``."""
        import torch

        blocks, size = u.shape
        pairs = u.view(blocks, size // (2 * self.delta), 2, self.delta)
        lo, hi = pairs[:, :, 0], pairs[:, :, 1]
        if self.delta % 8 == 0:  # eight codes per operation: a code <= 15 shifted by 4 stays in its byte
            lo, hi = lo.view(torch.int64), hi.view(torch.int64)
        paired = torch.bitwise_left_shift(hi, 4).bitwise_or_(lo).view(torch.uint8).view(blocks, size // 2)
        self._read(paired, out)

    def unpack(self, packed: Any, out: Any) -> None:
        """Blocks' bytes (torch uint8 ``[B, rows·k/2]``) → their codes, written to ``out [B, rows·k]``."""
        import torch

        blocks, half = packed.shape
        paired = torch.empty(blocks, half, dtype=torch.uint8)
        self._write(packed, paired)
        plane = paired.view(blocks, half // self.delta, self.delta)
        pairs = out.view(blocks, half // self.delta, 2, self.delta)
        lo, hi, mask = pairs[:, :, 0], pairs[:, :, 1], 15
        if self.delta % 8 == 0:  # eight bytes per operation, each byte masked on its own
            plane, lo, hi, mask = (
                plane.view(torch.int64),
                lo.view(torch.int64),
                hi.view(torch.int64),
                _LOW_NIBBLES,
            )
        lo.copy_(plane & mask)
        hi.copy_((plane >> 4) & mask)

    def _word(self) -> int:
        """Bytes moved as one word by the two-step transpose (1: copy byte by byte).

        Where the innermost dim reads the plane at a stride and the one outside it contiguously (a
        matrix transpose, every layout measured), ``w`` rows' bytes of a column are first gathered
        next to each other (a short-stride copy), then moved as one ``w``-byte word (a transpose of
        ``w`` times fewer elements): ~4x faster than a byte-wise strided copy here.
        """
        if len(self.dims) >= 2 and self.strides[-2] == 1:
            return next((w for w in (8, 4, 2) if self.dims[-1] % w == 0), 1)
        return 1

    def _staged(self, paired: Any, w: int) -> Any:
        """``paired [B, half]`` viewed ``[B, *outer, rows/w, cols, w]``; word (a, c) byte i: row a·w + i."""
        blocks, half = paired.shape
        outer, rows, row_stride = self.dims[:-2], self.dims[-1], self.strides[-1]
        return paired.as_strided(
            (blocks, *outer, rows // w, self.dims[-2], w),
            (half, *self.strides[:-2], w * row_stride, 1, row_stride),
        )

    def _read(self, paired: Any, out: Any) -> None:
        """The packed bytes read out of the paired plane ``[B, half]`` into ``out [B, half]``."""
        blocks, half = paired.shape
        w = self._word()
        if w == 1:
            out.view(blocks, *self.dims).copy_(paired.as_strided((blocks, *self.dims), (half, *self.strides)))
            return
        outer, cols, rows = self.dims[:-2], self.dims[-2], self.dims[-1]
        staged = self._staged(paired, w).contiguous().view(blocks, -1).view(_word_dtype(w))
        words = staged.view(blocks, *outer, rows // w, cols).transpose(-1, -2)
        out.view(_word_dtype(w)).view(blocks, *outer, cols, rows // w).copy_(words)

    def _write(self, packed: Any, paired: Any) -> None:
        """The inverse of :meth:`_read`: packed bytes ``[B, half]`` into the paired plane ``[B, half]``."""
        import torch

        blocks, half = packed.shape
        w = self._word()
        if w == 1:
            paired.as_strided((blocks, *self.dims), (half, *self.strides)).copy_(
                packed.view(blocks, *self.dims)
            )
            return
        outer, cols, rows = self.dims[:-2], self.dims[-2], self.dims[-1]
        words = packed.contiguous().view(_word_dtype(w)).view(blocks, *outer, cols, rows // w)
        staged = words.transpose(-1, -2).contiguous().view(blocks, -1).view(torch.uint8)
        target = self._staged(paired, w)
        target.copy_(staged.view(target.shape))


@dataclass(frozen=True, slots=True)
class BlockMap:
    """Where each packed byte's nibbles come from within one block of ``rows`` by ``k`` codes.

    ``lo``/``hi`` ``[rows·k/2]``: the code position (``row·k + col`` in the block) of each byte's low /
    high nibble; ``source`` ``[rows·k]``: for each code position, its nibble's index in the block's
    nibble plane (the ``rows·k/2`` low nibbles, then the high ones); ``plan``: the same map as strided
    copies where it is one (:class:`Transpose`, checked element by element against ``lo``/``hi``),
    else None and every byte goes through a gather.
    """

    rows: int
    k: int
    lo: Index
    hi: Index
    source: Index
    plan: Transpose | None = None

    def unpack(self, packed: U8, out: U8) -> None:
        """Blocks' bytes ``[B, rows·k/2]`` → their codes, written to ``out [B, rows·k]``."""
        if self.plan is not None:
            import torch

            self.plan.unpack(torch.from_numpy(packed), torch.from_numpy(out))
            return
        half = packed.shape[1]
        nibbles = np.empty((packed.shape[0], 2 * half), dtype=np.uint8)
        np.bitwise_and(packed, np.uint8(15), out=nibbles[:, :half])
        np.right_shift(packed, np.uint8(4), out=nibbles[:, half:])
        np.take(nibbles, self.source, axis=1, out=out, mode="clip")  # indices are in range by construction

    def pack(self, u: U8, out: U8) -> None:
        """Blocks' codes ``[B, rows·k]`` (0..15) → their bytes, written to ``out [B, rows·k/2]``."""
        if self.plan is not None:
            import torch

            self.plan.pack(torch.from_numpy(u), torch.from_numpy(out))
            return
        np.take(u, self.lo, axis=1, out=out, mode="clip")
        high = np.take(u, self.hi, axis=1, mode="clip")
        np.left_shift(high, np.uint8(4), out=high)
        np.bitwise_or(out, high, out=out)


@dataclass(frozen=True, slots=True)
class ByteMap:
    """int4pack's byte map for ``[N, K]`` weights with ``N % 64 == tail`` under ``isa`` (see module)."""

    isa: str
    k: int
    tail: int
    block: BlockMap
    tail_map: BlockMap | None

    def _rows(self, n: int, what: str) -> int:
        if n % BLOCK_ROWS != self.tail:
            raise ByteMapError(
                what, "rows", f"N with N % {BLOCK_ROWS} == {self.tail} (this map's tail)", f"N = {n}"
            )
        return n - self.tail

    def unpack(self, packed: U8) -> U8:
        """int4pack bytes ``[N, K/2]`` (packed under :attr:`isa`) → codes ``[N, K]`` (uint8, 0..15)."""
        n = packed.shape[0]
        if packed.shape != (n, self.k // 2) or packed.dtype != np.uint8:
            raise ByteMapError(
                "int4pack bytes", "shape", f"uint8 [N, {self.k // 2}]", f"{packed.dtype} {list(packed.shape)}"
            )
        full = self._rows(n, "int4pack bytes")
        out = np.empty((n, self.k), dtype=np.uint8)
        _apply(self.block.unpack, packed[:full], out[:full], self.k // 2, self.k)
        if self.tail_map is not None:
            self.tail_map.unpack(packed[full:].reshape(1, -1), out[full:].reshape(1, -1))
        return out

    def pack(self, u: npt.NDArray[np.integer[Any]]) -> U8:
        """Codes ``[N, K]`` (uint8 or int8, 0..15, checked by the caller) → int4pack bytes ``[N, K/2]``."""
        n = u.shape[0]
        if u.shape != (n, self.k) or u.dtype not in (np.uint8, np.int8):
            raise ByteMapError("codes", "shape", f"uint8 [N, {self.k}]", f"{u.dtype} {list(u.shape)}")
        codes = np.ascontiguousarray(u).view(np.uint8)
        full = self._rows(n, "codes")
        out = np.empty((n, self.k // 2), dtype=np.uint8)
        _apply(self.block.pack, codes[:full], out[:full], self.k, self.k // 2)
        if self.tail_map is not None:
            self.tail_map.pack(codes[full:].reshape(1, -1), out[full:].reshape(1, -1))
        return out

    def gathered(self) -> ByteMap:
        """The same map applied by gathers only (no :class:`Transpose` plans): benchmarks and tests."""
        tail = None if self.tail_map is None else replace(self.tail_map, plan=None)
        return replace(self, block=replace(self.block, plan=None), tail_map=tail)


def _apply(step: Any, src: U8, dst: U8, src_row: int, dst_row: int) -> None:
    """``step`` over the 64-row blocks of ``src``/``dst`` (row-major, whole blocks), a few at a time."""
    blocks = src.shape[0] // BLOCK_ROWS
    src_b = src.reshape(blocks, BLOCK_ROWS * src_row)
    dst_b = dst.reshape(blocks, BLOCK_ROWS * dst_row)
    for b in range(0, blocks, CHUNK_BLOCKS):
        step(src_b[b : b + CHUNK_BLOCKS], dst_b[b : b + CHUNK_BLOCKS])


def refuse(learnt: ByteMap, refusal: ByteMapError) -> None:
    """Drop ``learnt`` for the rest of the process (it disagreed with the converter on a real weight)."""
    _REFUSED[(learnt.isa, learnt.k, learnt.tail)] = refusal


def byte_map(k: int, tail: int) -> ByteMap:
    """The byte map for ``[N, K]`` weights with ``N % 64 == tail`` under the ISA torch dispatches to now.

    Learnt from the converter on first use in this process (a few milliseconds per (ISA, K, tail)) and
    cached, refusals included; raises :class:`~.errors.ByteMapError` where the map is refused.
    """
    isa = cpu_isa()
    learnt = _REFUSED.get((isa, k, tail)) or _learn(isa, k, tail)
    if isinstance(learnt, ByteMapError):
        raise learnt
    return learnt


#: Maps refused after they were learnt (:func:`refuse`), by (ISA, K, tail): a process-local cache like
#: :func:`_learn`'s.
_REFUSED: dict[tuple[str, int, int], ByteMapError] = {}


@functools.cache
def _learn(isa: str, k: int, tail: int) -> ByteMap | ByteMapError:
    where = f"int4pack byte map ({isa}, K {k}, N % {BLOCK_ROWS} = {tail})"
    try:
        return _derive(where, isa, k, tail)
    except ByteMapError as refused:
        return refused


def _convert(codes: npt.NDArray[np.int32], where: str) -> U8:
    """Run torch's converter on int32 codes ``[rows, K]`` → uint8 ``[rows, K/2]`` (its result checked)."""
    import torch

    rows, k = codes.shape
    try:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes), 1)
    except RuntimeError as e:
        raise ByteMapError(where, "the converter on a position probe", "packed bytes", str(e)) from e
    if packed.dtype != torch.uint8 or tuple(packed.shape) != (rows, k // 2):
        raise ByteMapError(
            where, "converter output", f"uint8 [{rows}, {k // 2}]", f"{packed.dtype} {list(packed.shape)}"
        )
    out: U8 = packed.numpy()
    return out


def _derive(where: str, isa: str, k: int, tail: int) -> ByteMap:
    if k <= 0 or k % PROBE_GROUP or tail % 16 or not 0 <= tail < BLOCK_ROWS:
        raise ByteMapError(
            where, "shape", f"K a multiple of {PROBE_GROUP} and N % 64 in 0, 16, 32, 48", (k, tail)
        )
    rows = 2 * BLOCK_ROWS + tail
    count = rows * k
    position = np.arange(count, dtype=np.int64).reshape(rows, k)
    lo = np.zeros(count // 2, dtype=np.int64)
    hi = np.zeros(count // 2, dtype=np.int64)
    shift = 0
    while (1 << shift) < count:  # one probe per hex digit of the largest position
        digit = ((position >> shift) & 15).astype(np.int32)
        packed = _convert(digit, where).reshape(-1).astype(np.int64)
        lo |= (packed & 15) << shift
        hi |= (packed >> 4) << shift
        shift += 4
    held = np.concatenate([lo, hi])
    if held.max(initial=0) >= count or np.any(np.bincount(held, minlength=count) != 1):
        seen = np.bincount(held[held < count], minlength=count)
        raise ByteMapError(
            where,
            "nibbles of the packed probe",
            f"every one of the {count} code positions exactly once",
            f"{int(np.count_nonzero(seen == 0))} positions missing, {int(np.count_nonzero(seen > 1))} "
            f"held more than once, {int(np.count_nonzero(held >= count))} nibbles holding no position",
        )
    half, span = BLOCK_ROWS * k // 2, BLOCK_ROWS * k
    first = _block(where, "the first 64-row block", lo[:half], hi[:half], BLOCK_ROWS, k)
    second = _block(
        where,
        "the second 64-row block",
        lo[half : 2 * half] - span,
        hi[half : 2 * half] - span,
        BLOCK_ROWS,
        k,
    )
    if not (np.array_equal(first.lo, second.lo) and np.array_equal(first.hi, second.hi)):
        raise ByteMapError(
            where, "the second 64-row block", "packed as the first, 64 rows on", "another arrangement"
        )
    tail_map = None
    if tail:
        tail_map = _block(
            where, f"the {tail}-row tail", lo[2 * half :] - 2 * span, hi[2 * half :] - 2 * span, tail, k
        )
    learnt = ByteMap(isa=isa, k=k, tail=tail, block=first, tail_map=tail_map)
    _prove(where, learnt, rows)
    return learnt


def _block(
    where: str, label: str, lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64], rows: int, k: int
) -> BlockMap:
    """A block's map from its bytes' positions (relative to the block), which must all lie in the block."""
    size = rows * k
    for nibbles in (lo, hi):
        outside = (nibbles < 0) | (nibbles >= size)
        if outside.any():
            r = int(nibbles[np.argmax(outside)]) // k
            raise ByteMapError(
                where, f"bytes of {label}", f"only its own codes (rows 0..{rows - 1})", f"a code of row {r}"
            )
    half = size // 2
    source = np.empty(size, dtype=np.int32)
    source[lo] = np.arange(half, dtype=np.int32)
    source[hi] = np.arange(half, 2 * half, dtype=np.int32)
    return BlockMap(rows, k, lo.astype(np.int32), hi.astype(np.int32), source, _transpose(lo, hi, size))


def _transpose(lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64], size: int) -> Transpose | None:
    """The block's map as a :class:`Transpose` if it is one (checked against every byte), else None."""
    delta = int(hi[0] - lo[0]) if lo.size else 0
    if delta <= 0 or size % (2 * delta) or np.any(hi - lo != delta) or np.any((lo // delta) % 2):
        return None
    paired = (lo // (2 * delta)) * delta + lo % delta  # each byte's index in the paired plane
    dims: list[int] = []
    strides: list[int] = []
    rest = paired
    while rest.size > 1 and len(dims) < 8:  # peel the innermost run of equal steps, then the next
        step = int(rest[1] - rest[0])
        steps = np.diff(rest) != step
        run = int(np.argmax(steps)) + 1 if steps.any() else rest.size
        if step <= 0 or run == 1 or rest.size % run:
            return None
        rows = rest.reshape(-1, run)
        if not np.array_equal(rows - rows[:, :1], np.broadcast_to(np.arange(run) * step, rows.shape)):
            return None
        dims.insert(0, run)
        strides.insert(0, step)
        rest = rows[:, 0]
    if rest.size != 1 or int(rest[0]) != 0:
        return None
    index = np.zeros(tuple(dims), dtype=np.int64)
    for axis, (n, step) in enumerate(zip(dims, strides, strict=True)):
        shape = [1] * len(dims)
        shape[axis] = n
        index = index + (np.arange(n, dtype=np.int64) * step).reshape(shape)
    return Transpose(delta, tuple(dims), tuple(strides)) if np.array_equal(index.ravel(), paired) else None


def _prove(where: str, learnt: ByteMap, rows: int) -> None:
    """Random codes: map packing == the converter's bytes, map unpacking and the kernel give the codes."""
    import torch

    k = learnt.k
    codes = np.random.default_rng(rows * k).integers(0, 16, size=(rows, k), dtype=np.uint8)
    packed = _convert(codes.astype(np.int32), where)
    gathered = learnt.gathered()
    checks = (
        ("map packing vs the converter's bytes", learnt.pack(codes), packed),
        ("map unpacking of the converter's bytes", learnt.unpack(packed), codes),
        ("map packing by gathers vs the converter's bytes", gathered.pack(codes), packed),
        ("map unpacking by gathers of the converter's bytes", gathered.unpack(packed), codes),
        (
            "the kernel's read-back of the converter's bytes",
            kernel_codes(torch.from_numpy(packed), rows, k),
            codes,
        ),
    )
    for what, got, want in checks:
        if not np.array_equal(got, want):
            r, c = (int(i) for i in np.argwhere(got != want)[0])
            raise ByteMapError(where, what, f"{want[r, c]} at [{r}, {c}] of random codes", got[r, c])


def kernel_codes(
    packed: Any, n: int, k: int, group: int = PROBE_GROUP, columns: npt.NDArray[np.int64] | None = None
) -> I8:
    """Read int4pack codes back out of ``packed`` by running ``_weight_int4pack_mm_for_cpu`` itself.

    Every (scale, zero) is (1, 0), so the kernel computes ``Σ_k x[t, k]·(u[n, k] - 8)``; activation row
    ``t`` (bfloat16) holds 1 at one column ``a`` and 16 at another ``b`` (``columns``: which K columns;
    all when None), so the output is ``(u_a - 8) + 16·(u_b - 8)``, an integer in -136..119: exact in
    bfloat16 (every partial sum too), and ``+ 136`` gives back ``u_a + 16·u_b`` -- two codes per row,
    under the ISA that packed them. An output that is not such an integer (a kernel that does not
    compute what the probe assumes) reads back as code -1, which no plane holds. Returns int8
    ``u [n, len(columns)]`` (contiguous: the ladder compares it element by element, twice).
    """
    import torch

    cols = np.arange(k) if columns is None else np.asarray(columns, dtype=np.int64)
    ones = torch.zeros(k // group, n, 2, dtype=torch.bfloat16)
    ones[..., 0] = 1.0
    out = torch.empty(cols.size, n, dtype=torch.int8)  # [position, n]; returned transposed
    for at in range(0, cols.size, PROBE_COLUMNS):
        stop = min(at + PROBE_COLUMNS, cols.size)
        lo = torch.from_numpy(cols[at:stop:2])  # probed at weight 1
        hi = torch.from_numpy(cols[at + 1 : stop : 2])  # at weight 16 (none for a last odd column)
        x = torch.zeros(lo.numel(), k, dtype=torch.bfloat16)
        x[torch.arange(lo.numel()), lo] = 1.0
        x[torch.arange(hi.numel()), hi] = 16.0
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, ones)  # [rows, n]
        v = y.to(torch.int16)
        bad = (v.to(torch.bfloat16) != y) | (v < -136) | (v > 119)
        v += 136
        out[at:stop:2] = (v & 15).masked_fill_(bad, -1)
        out[at + 1 : stop : 2] = (v >> 4).masked_fill_(bad, -1)[: hi.numel()]
    found: I8 = out.t().contiguous().numpy()
    return found
