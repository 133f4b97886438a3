"""A prepared linear operator: one rank's weight in the layout one kernel consumes, ready to run.

Preparation happens once, at load time, on the rank. What it holds is a load-time product: packed
layouts depend on the CPU ISA torch dispatches to, so a prepared operator records the ISA it was packed
under, refuses to run under another, and refuses to be pickled (it is never persisted).
"""

from __future__ import annotations

import abc
from typing import Any, Literal, NoReturn

import numpy as np
import numpy.typing as npt

from .budget import Budget
from .capability import OperatorSignature, Transformation
from .device import cpu_isa
from .errors import ActivationError, IsaMismatchError, NotPersistableError
from .weight import RankWeight

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
#: Codes in whatever integer dtype a read-back gives them (the ladder compares them as numbers).
Codes = npt.NDArray[np.integer[Any]]

#: What a kernel read back for K columns over every row: (the reference's, the kernel's, which quantity)
#: -- ``codes`` (integers, compared exactly) or ``values`` (binary32, compared exactly as numbers).
ColumnCheck = tuple[npt.NDArray[Any], npt.NDArray[Any], Literal["codes", "values"]]

#: Rows decoded at a time where a prepared layout is decoded or compared (bounds the workspace).
ROW_CHUNK = 256


class PreparedLinear(abc.ABC):
    """``y = x @ W.T`` for one rank's weight ``W [n_local, k_local]`` in one kernel's layout.

    ``transformation``: what preparation did (none | repack | conversion | generic | full-dequant);
    ``conversion_error``: the largest ``|W_kernel - W_reference|`` of the prepared layout (0.0 when
    the codes and scales were only permuted; measured, recorded in the trace, never a tolerance: parity
    holds a conversion to :meth:`conversion_budget`); ``isa``: the CPU ISA a packed layout was made under
    (None where the layout does not depend on it). ``no_codes``: why parity L1 cannot read codes back
    where the layout offers neither :meth:`code_check` nor :meth:`column_check`.
    """

    no_codes = "the kernel offers no read-back of the codes it holds"

    def __init__(
        self,
        kernel: str,
        op: OperatorSignature,
        transformation: Transformation,
        *,
        isa: str | None = None,
        conversion_error: float = 0.0,
    ) -> None:
        self.kernel = kernel
        self.op = op
        self.transformation: Transformation = transformation
        self.isa = isa
        self.conversion_error = conversion_error

    def __reduce__(self) -> NoReturn:
        raise NotPersistableError(
            self.op.weight,
            "pickling a prepared layout",
            "preparation on the rank at load time",
            f"a request to persist {self.kernel}'s layout",
            "packed layouts depend on the CPU ISA and the torch build; prepare them again on load",
        )

    def _check_isa(self) -> None:
        if self.isa is not None and (now := cpu_isa()) != self.isa:
            raise IsaMismatchError(
                self.op.weight,
                f"CPU ISA of {self.kernel}'s packed layout",
                self.isa,
                now,
                "bytes packed under one ISA run wrong under another; prepare the weight again here",
            )

    def __call__(self, x: Any) -> Any:
        """Run on activations ``x [T, k_local]`` (torch, the op's dtype); returns ``[T, n_local]``."""
        import torch

        want = getattr(torch, self.op.activation_dtype)
        if (
            not isinstance(x, torch.Tensor)
            or x.dim() != 2
            or x.shape[1] != self.op.k_local
            or x.dtype != want
        ):
            found = f"{type(x).__name__} {getattr(x, 'dtype', '?')} {list(getattr(x, 'shape', []))}"
            raise ActivationError(
                self.op.weight, "activations", f"a 2-D {want} tensor [T, {self.op.k_local}]", found
            )
        self._check_isa()
        return self._run(x.contiguous())

    @abc.abstractmethod
    def _run(self, x: Any) -> Any:
        """The kernel call on validated, contiguous activations."""

    @property
    @abc.abstractmethod
    def resident_bytes(self) -> int:
        """Bytes this prepared operator keeps alive (tensors it owns or references)."""

    @abc.abstractmethod
    def decode_rows(self, start: int, stop: int) -> F32:
        """Rows ``start..stop`` of the weight as this layout holds it, in binary32 (for parity L2)."""

    def decode(self) -> F32:
        """The whole rank-local weight as this layout holds it (binary32; small weights / tests)."""
        parts = [
            self.decode_rows(r, min(r + ROW_CHUNK, self.op.n_local))
            for r in range(0, self.op.n_local, ROW_CHUNK)
        ]
        return np.concatenate(parts, axis=0)

    def code_check(self, weight: RankWeight) -> tuple[I64, I64] | None:
        """For a repacked layout: (codes as ``weight``'s planes hold them, codes read back from the layout).

        Both ``[n_local, k_local]`` in the kernel's code domain; None for layouts without codes.
        """
        return None

    def column_check(
        self,
        weight: RankWeight,
        columns: npt.NDArray[np.int64],
        reference: F32 | None = None,
        rows: I64 | None = None,
    ) -> ColumnCheck | None:
        """For a layout without :meth:`code_check`: K ``columns`` over every row, read back by the kernel.

        Returns ``(expected, found, quantity)`` ``[n_local, len(columns)]`` (``[len(rows), ...]`` with
        ``rows``: a sampled ladder's), the kernel's reading run through its own matmul on one-hot
        binary32 activations (exact: each output is one product by 1 plus products by 0), or None (the
        default). ``reference``: the slice's full reference decode, where the caller has it.
        """
        return None

    def conversion_budget(self, weight: RankWeight, reference: F32) -> Budget | None:
        """Per element, the largest ``|W_layout - W_reference|`` the layout's conversion may cause.

        From the weight's own terms and the formats the layout holds them in (:mod:`.budget`), never
        from :attr:`conversion_error`. None (the default): no budget, the layout must equal the
        reference decode exactly.
        """
        return None

    def map_codes(self) -> Codes | None:
        """Codes read back out of the layout without running the kernel, or None (the default).

        A layout with a byte map learnt from its packer returns ``[n_local, k_local]``.
        """
        return None

    def map_check(self, weight: RankWeight) -> tuple[Codes, Codes] | None:
        """(codes as ``weight``'s planes hold them, :meth:`map_codes`), or None without a byte map.

        The sampled ladder's L1 uses it where it exists (else :meth:`code_check`); the full ladder
        compares :meth:`map_codes` with the kernel's read-back.
        """
        return None

    def kernel_columns(self, columns: npt.NDArray[np.int64]) -> Codes | None:
        """Codes of K ``columns`` over every row, read back by running the kernel itself, or None.

        A layout with a byte map returns ``[n_local, len(columns)]``: the sampled ladder holds the map
        to the kernel on these columns of every weight (:func:`.parity.level1_by_map`).
        """
        return None

    def read_back(self, weight: RankWeight) -> tuple[F32, tuple[I64, I64] | None]:
        """:meth:`decode` and :meth:`code_check` together (parity L1 and L2 of one ladder).

        A layout whose decode reads its codes back through the kernel overrides this to read them once.
        """
        return self.decode(), self.code_check(weight)
