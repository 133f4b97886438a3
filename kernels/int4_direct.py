"""Direct int4 kernel: ``y = x @ W.T`` from a rank's GPTQ / AWQ / compressed-tensors int4 planes as loaded.

The code plane is used as it is (transformation ``none``, like the GGUF direct kernel): no repack,
no persistent float copy. Each call walks the plane a slab of whole container lines at a time
(:mod:`.int4_tiles`), decodes the slab into one float32 tile of at most :data:`TILE_ELEMENTS`
elements -- the 4-bit fields split by whole-line shifts and masks, then ``(q - z)·s`` by the decode
law -- and multiplies it (``torch.addmm`` into ``y`` for slabs of K, ``torch.mm`` into rows of
``y.T`` for slabs of N). The slab runs along the plane's first physical axis, so every op reads and
writes contiguous lines: K for GPTQ ``qweight [K/8, N]`` and AWQ ``qweight [K, N/8]``, N for
compressed-tensors ``weight_packed [N, K/8]``.

Exactness (parity L2 compares the same tile decoder with the registry's reference, element by
element): the fields are widened to float32 exactly; ``q - z`` is formed on small integers (exact in
binary32: ``z`` is held as ``z - lo`` where ``lo`` is the encoding's offset, e.g. -8 for
``s4_offset8``; a float zero plane subtracts after ``+lo``, in the law's order); the product by the
binary32 scale is the law's one rounding; ``affine_round_to_scale_format`` rounds it to the scale's
format (round to nearest even, as the reference). Scales and zero points are prepared once in
binary32, in tile-position order (``[G, N]`` for slabs of K, ``[N, G]`` for slabs of N): the small
per-group terms this kernel keeps besides the codes (counted in :attr:`resident_bytes`).

Groups: where every tile position's group is its position divided by the group size (sequential
groups on word boundaries, a partial last group included), the scales broadcast over a view of the
tile; otherwise (act-order ``g_idx``, groups not on word boundaries) each slab gathers its positions'
rows of scales and zero points (``index_select``, one more pass over the tile). A permutation plane
is a gather of the activations' columns. Activations float32, bfloat16 or float16 are widened to
float32; the result is cast back to the activation dtype.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from shardport.registry.contracts.decode import affine_qparams, affine_terms
from shardport.registry.contracts.encodings import encoding_value_range
from shardport.registry.contracts.formats import as_plane
from shardport.registry.contracts.model import (
    AffineIntContract,
    LogicalShape,
    PermutationPlane,
    ZeroFloatPlane,
)
from shardport.registry.contracts.permutation import read_permutation

from .capability import Capability, OperatorSignature
from .errors import KernelInputError
from .int4_tiles import TileLayout, container_view, decode_codes, tile_layout
from .prepared import F32, ColumnCheck, PreparedLinear
from .weight import RankWeight

#: Elements of one float32 tile (4 MiB, as the GGUF direct kernel's 256 x 4096): 256 lines of a 4096-wide
#: weight (measured at N = K = 4096, one thread, T = 1: 2**18 / 2**19 / 2**20 elements 17.6 / 14.0 / 11.7 ms
#: for GPTQ, 9.1 / 7.1 / 6.7 ms for AWQ, 11.5 / 9.1 / 8.3 ms for compressed-tensors).
TILE_ELEMENTS = 1 << 20
#: Scratch per tile element: the float32 tile, the integer split (<= 4 bytes), a gathered scale or
#: zero slab (4), the rounding to a 16-bit scale format (2). A slab is at least one container line, which
#: is ``unit`` tile rows (8 for 32-bit words packed along the outer axis, GPTQ's ``qweight [K/8, N]``), so
#: an inner extent over ``TILE_ELEMENTS / unit`` (N > 131,072 for GPTQ, e.g. a 151,936-row quantized head)
#: takes one line's worth, above the capability's declared bound; :attr:`PreparedInt4Direct.workspace`
#: says what a weight uses.
WORKSPACE_BYTES_PER_ELEMENT = 14
ENCODINGS = ("u4", "s4_twos", "s4_offset8")
#: Rows of the registry's generic unpacking per call in parity L1 (int64 codes: 8 bytes per element).
UNPACK_ROWS = 1024
_ROUND = {"binary16": "float16", "bfloat16": "bfloat16"}

CAPABILITY = Capability(
    id="cpu.int4-direct",
    version="1",
    abi="shardport.kernels.int4_direct (tiled 4-bit field decode + torch.mm/addmm, float32)",
    layouts=tuple(f"affine:{e}:{s}*" for e in ENCODINGS for s in ("slots", "bitstream")),
    code_encodings=ENCODINGS,
    scale_formats=("binary16", "bfloat16", "binary32"),
    scale_signs=("positive", "signed"),
    scale_levels=(1,),
    zero_points=("none", "implicit", "int_plane/as_is", "int_plane/minus_one", "float_plane"),
    group_sizes=None,
    scale_per_row=False,
    act_order=True,
    permutation=True,
    tail_group=True,
    workspace_bytes=TILE_ELEMENTS * WORKSPACE_BYTES_PER_ELEMENT,
    transformation="none",
)


def _fail(weight: RankWeight, what: str, expected: Any, found: Any) -> KernelInputError:
    return KernelInputError(weight.where, what, expected, found, "cpu.int4-direct takes packed 4-bit codes")


def _contract(weight: RankWeight) -> AffineIntContract:
    c = weight.contract
    if not isinstance(c, AffineIntContract):
        raise _fail(weight, "contract family", "affine_int", c.family)
    if c.codes.bits != 4 or c.codes.encoding not in ENCODINGS:
        raise _fail(weight, "codes", f"4-bit, one of {list(ENCODINGS)}", (c.codes.bits, c.codes.encoding))
    if c.scales.format not in ("binary16", "bfloat16", "binary32"):
        raise _fail(weight, "scales.format", "binary16, bfloat16 or binary32", c.scales.format)
    if not np.little_endian:  # the planes are little-endian; the tile decoder reads them in place
        raise _fail(weight, "host byte order", "little-endian", "big-endian")
    return c


def _slabs(total: int, rows: int, unit: int, group: int | None) -> list[tuple[int, int]]:
    """Slabs of ``total`` outer positions: ``rows`` at most, boundaries on multiples of ``unit``.

    With ``group``, each slab is whole groups or lies inside one group (the last, partial one included).
    """
    rows = max(unit, rows // unit * unit)
    if group is None:
        return [(p, min(p + rows, total)) for p in range(0, total, rows)]
    if group > rows:
        return [
            (p, min(p + rows, g + group, total))
            for g in range(0, total, group)
            for p in range(g, min(g + group, total), rows)
        ]
    step = rows // group * group
    whole = total // group * group
    out = [(p, min(p + step, whole)) for p in range(0, whole, step)]
    return out + ([(whole, total)] if whole < total else [])


class PreparedInt4Direct(PreparedLinear):
    """The code plane as loaded (a zero-copy view) and binary32 scales/zeros in tile-position order."""

    def __init__(
        self, weight: RankWeight, op: OperatorSignature, kernel: str, *, tile_elements: int = TILE_ELEMENTS
    ) -> None:
        import torch

        super().__init__(kernel, op, "none")
        c = _contract(weight)
        n, k = weight.n_local, weight.k_local
        codes = c.codes
        plane = as_plane(weight.planes["codes"], codes.physical_dtype, codes.physical_shape, codes.plane)
        layout = tile_layout(weight.where, codes.physical_axes, codes.packing, plane.shape, n, k)
        self.layout = layout
        self.twos = codes.encoding == "s4_twos"
        with warnings.catch_warnings():  # read-only planes: never written
            warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
            self.codes = torch.from_numpy(container_view(layout, plane))
        shape = LogicalShape(axes=("N", "K"), extents=(n, k))
        zero, scale, group = affine_qparams(c, weight.named_planes, shape, weight.where)
        n_pos, k_pos = layout.n_elem, layout.k_elem
        rows_of_n = np.maximum(n_pos, 0)
        lo = encoding_value_range(codes.encoding)[0]
        self.plus_lo = float(lo) if isinstance(c.zero_point, ZeroFloatPlane) and lo else 0.0
        z = zero.astype(np.float32) if self.plus_lo else (zero - lo).astype(np.float32)
        self.zero_scalar: float | None = float(z.flat[0]) if z.size and np.all(z == z.flat[0]) else None
        k_outer = layout.outer == "K"

        def oriented(values: F32) -> Any:
            rows = values[rows_of_n]  # [N positions, G]
            return torch.from_numpy(np.ascontiguousarray(rows.T if k_outer else rows, dtype=np.float32))

        self.scale = oriented(scale)
        self.zero = None if self.zero_scalar is not None else oriented(z)
        groups = group[np.maximum(k_pos, 0)]  # each K position's group
        self.group_size = c.scales.group_size
        self.broadcast = self._broadcastable(groups, layout)
        self.groups = None if self.broadcast else torch.from_numpy(groups)
        rounds = c.decode_law == "affine_round_to_scale_format"
        self.round_to = _ROUND.get(c.scales.format) if rounds else None
        columns = np.arange(k, dtype=np.int64)
        if isinstance(c.permutation, PermutationPlane):
            perm = read_permutation(weight.where, c.permutation, weight.named_planes, k)
            columns = np.argsort(perm) if c.permutation.direction == "logical_to_stored" else perm
        x_index = np.where(k_pos >= 0, columns[np.maximum(k_pos, 0)], k)
        identity = x_index.size == k and np.array_equal(x_index, np.arange(k))
        self.x_index = None if identity else torch.from_numpy(x_index)
        self.x_pad = bool(np.any(k_pos < 0))
        # positions past the logical K (a tail container's unused fields) read a zero activation column,
        # but (q - z)·s there can overflow to inf (their group's terms are borrowed) and 0·inf is NaN:
        # the tile is zeroed there after the affine step
        pads = np.flatnonzero(k_pos < 0)
        self.pad = torch.from_numpy(pads) if pads.size else None
        out_index = np.empty(n, dtype=np.int64)
        out_index[n_pos[n_pos >= 0]] = np.flatnonzero(n_pos >= 0)
        identity = n_pos.size == n and np.array_equal(out_index, np.arange(n))
        self.out_index = None if identity else torch.from_numpy(out_index)
        cols = layout.cols
        group_rows = self.group_size if self.broadcast and k_outer else None
        self.slabs = _slabs(layout.rows, tile_elements // cols, layout.unit, group_rows)
        self.workspace = max(b - a for a, b in self.slabs) * cols * WORKSPACE_BYTES_PER_ELEMENT

    def _broadcastable(self, groups: npt.NDArray[np.int64], layout: TileLayout) -> bool:
        """Whether each K position's group is its index (within its plane) over the group size."""
        size = self.group_size
        if layout.outer == "K":
            if size % layout.unit:
                return False
            return bool(np.array_equal(groups, np.arange(groups.size) // size))
        if size % layout.planes:
            return False
        run = groups.size // layout.planes
        pattern = np.arange(run) // (size // layout.planes)
        return bool(np.all(groups.reshape(layout.planes, run) == pattern))

    # -- the tile decoder -------------------------------------------------------------------------

    def _affine(self, tile: Any, p0: int, p1: int) -> None:
        """``(q - z)·s`` (and the law's rounding) on a tile of stored fields, in place."""
        import torch

        if self.plus_lo:
            tile.add_(self.plus_lo)
        zero, scale = self.zero, self.scale
        if self.layout.outer == "K":
            if not self.broadcast:
                assert self.groups is not None
                at = self.groups[p0:p1]
                zero, scale = (None if zero is None else zero.index_select(0, at)), scale.index_select(0, at)
                view = tile
            elif p0 // self.group_size == (p1 - 1) // self.group_size:  # inside one group
                g = p0 // self.group_size
                zero, scale, view = (None if zero is None else zero[g]), scale[g], tile
            else:
                g0, count = p0 // self.group_size, (p1 - p0) // self.group_size
                view = tile.view(count, self.group_size, -1)
                zero = None if zero is None else zero[g0 : g0 + count, None]
                scale = scale[g0 : g0 + count, None]
            self._sub_mul(view, zero, scale)
        elif not self.broadcast:
            assert self.groups is not None
            rows = slice(p0, p1)
            zero = None if zero is None else zero[rows].index_select(1, self.groups)
            self._sub_mul(tile, zero, scale[rows].index_select(1, self.groups))
        else:
            self._rows_by_group(tile, p0, p1)
        if self.round_to is not None:
            tile.copy_(tile.to(getattr(torch, self.round_to)))

    def _rows_by_group(self, tile: Any, p0: int, p1: int) -> None:
        """Slabs of N: each plane's run of K positions is whole groups of ``size / planes`` and a tail."""
        planes = self.layout.planes
        run = tile.shape[1] // planes
        per = self.group_size // planes
        whole = run // per
        view = tile.view(tile.shape[0], planes, run)
        zero = None if self.zero is None else self.zero[p0:p1]
        scale = self.scale[p0:p1]
        if whole:
            body = view[:, :, : whole * per].unflatten(2, (whole, per))
            self._sub_mul(
                body, None if zero is None else zero[:, None, :whole, None], scale[:, None, :whole, None]
            )
        if whole * per < run:
            tail = view[:, :, whole * per :]
            self._sub_mul(
                tail,
                None if zero is None else zero[:, None, whole : whole + 1],
                scale[:, None, whole : whole + 1],
            )

    def _sub_mul(self, view: Any, zero: Any, scale: Any) -> None:
        if zero is not None:
            view.sub_(zero)
        elif self.zero_scalar:
            view.sub_(self.zero_scalar)
        view.mul_(scale)

    def _tiles(self) -> Iterator[tuple[int, int, Any]]:
        """Each slab's outer positions and its decoded tile (one workspace, reused: consume in turn)."""
        import torch

        cols = self.layout.cols
        workspace = torch.empty(max(b - a for a, b in self.slabs), cols, dtype=torch.float32)
        for p0, p1 in self.slabs:
            tile = workspace[: p1 - p0]
            decode_codes(self.layout, self.codes, p0, p1, tile, self.twos)
            self._affine(tile, p0, p1)
            if self.pad is not None:
                if self.layout.outer == "K":  # pad positions are tile rows
                    inside = self.pad[(self.pad >= p0) & (self.pad < p1)]
                    if inside.numel():
                        tile.index_fill_(0, inside - p0, 0.0)
                else:  # pad positions are tile columns
                    tile.index_fill_(1, self.pad, 0.0)
            yield p0, p1, tile

    # -- the operator ---------------------------------------------------------------------------

    def _run(self, x: Any) -> Any:
        import torch

        with torch.no_grad():
            return self.matmul(x.to(torch.float32)).to(x.dtype)

    def matmul(self, x32: Any) -> Any:
        """``x32 @ W.T`` in float32 (``x32 [T, k_local]`` float32) by tiles."""
        import torch

        t = x32.shape[0]
        if self.x_pad:
            x32 = torch.cat([x32, x32.new_zeros(t, 1)], dim=1)
        xs = x32 if self.x_index is None else x32.index_select(1, self.x_index)
        if self.layout.outer == "K":
            y = torch.zeros(t, self.layout.cols, dtype=torch.float32)
            if t:
                for p0, p1, tile in self._tiles():
                    y.addmm_(xs[:, p0:p1], tile)
        else:
            out_t = torch.empty(self.layout.rows, t, dtype=torch.float32)
            if t:
                xs_t = xs.t()
                for p0, p1, tile in self._tiles():
                    torch.mm(tile, xs_t, out=out_t[p0:p1])
            y = out_t.t()
        if self.out_index is not None:
            return y.index_select(1, self.out_index)
        return y.contiguous()

    @property
    def resident_bytes(self) -> int:
        """The code plane (shared with the loader's array) and the binary32 per-group terms."""
        held = [self.codes, self.scale, self.zero, self.groups, self.x_index, self.out_index]
        return int(sum(a.numel() * a.element_size() for a in held if a is not None))

    def decode(self) -> F32:
        """The whole weight ``[n_local, k_local]`` through the kernel's own tile decoder (for proofs)."""
        n, k = self.op.n_local, self.op.k_local
        out = np.zeros((n, k), dtype=np.float32)
        n_pos, k_pos = self.layout.n_elem, self.layout.k_elem
        x_index = np.arange(k_pos.size) if self.x_index is None else self.x_index.numpy()
        columns = np.where(k_pos >= 0, x_index, -1)  # each K position's logical column
        for p0, p1, tile in self._tiles():
            values = tile.numpy()
            if self.layout.outer == "K":
                keep = columns[p0:p1] >= 0
                rows = n_pos >= 0
                out[np.ix_(n_pos[rows], columns[p0:p1][keep])] = values[keep][:, rows].T
            else:
                keep = n_pos[p0:p1] >= 0
                cols = columns >= 0
                out[np.ix_(n_pos[p0:p1][keep], columns[cols])] = values[keep][:, cols]
        return out

    def decode_rows(self, start: int, stop: int) -> F32:
        """Rows of :meth:`decode` (the whole tile walk: for proofs on small weights)."""
        return self.decode()[start:stop]

    def probe_codes(self, columns: npt.NDArray[np.int64]) -> F32:
        """The codes ``u = q - lo`` of K ``columns`` over every row, read back through :meth:`matmul`.

        The kernel runs as it always does (container view, field split, slabs, the permutation's gather
        of activations, the output order) on one-hot binary32 activations, with every scale 1 and every
        zero point 0 for the call: the tile then holds the stored fields as ``u`` (0..15) and each output
        is ``1·u`` plus products by 0, exact. Returns ``[n_local, len(columns)]`` (binary32 integers).
        """
        import torch

        held = (self.scale, self.zero, self.zero_scalar, self.plus_lo, self.round_to)
        x = torch.zeros(len(columns), self.op.k_local, dtype=torch.float32)
        x[torch.arange(len(columns)), torch.from_numpy(np.asarray(columns, dtype=np.int64))] = 1.0
        try:
            self.scale, self.zero, self.zero_scalar = torch.ones_like(self.scale), None, None
            self.plus_lo, self.round_to = 0.0, None
            with torch.no_grad():
                y = self.matmul(x)
        finally:
            self.scale, self.zero, self.zero_scalar, self.plus_lo, self.round_to = held
        out: F32 = np.ascontiguousarray(y.t().numpy())
        return out

    def column_check(
        self,
        weight: RankWeight,
        columns: npt.NDArray[np.int64],
        reference: F32 | None = None,
        rows: npt.NDArray[np.int64] | None = None,
    ) -> ColumnCheck | None:
        """(codes ``q - lo`` by the registry's generic unpacking, the kernel's: :meth:`probe_codes`).

        The kernel walks every row either way (its slabs follow the stored layout); ``rows`` restricts
        the comparison, and the generic unpacking, to those rows. The unpacking runs
        :data:`UNPACK_ROWS` rows at a time (its int64 codes of a whole large weight would not fit).
        """
        c = _contract(weight)
        shape = LogicalShape(axes=("N", "K"), extents=(weight.n_local, weight.k_local))
        at = np.arange(weight.n_local) if rows is None else np.asarray(rows, dtype=np.int64)
        lo = encoding_value_range(c.codes.encoding)[0]
        parts = []
        for i in range(0, at.size, UNPACK_ROWS):
            chunk = [int(r) for r in at[i : i + UNPACK_ROWS]]
            terms = affine_terms(c, weight.named_planes, shape, chunk, weight.where)
            stored = columns if terms.columns is None else terms.columns[columns]
            parts.append(terms.q[:, stored] - lo)
        expected = np.concatenate(parts) if parts else np.zeros((0, columns.size), dtype=np.int64)
        found = self.probe_codes(columns)
        return expected, found if rows is None else found[rows], "codes"


class Int4DirectKernel:
    """Direct int4 kernel: GPTQ / AWQ / compressed-tensors int4 planes as loaded, decoded a tile at a time."""

    capability = CAPABILITY

    def prepare(self, weight: RankWeight, op: OperatorSignature) -> PreparedLinear:
        """Nothing to repack: a view of the code plane and the binary32 per-group terms."""
        cap = self.capability
        return PreparedInt4Direct(weight, op, f"{cap.id}@{cap.version}")
