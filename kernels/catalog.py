"""The kernels a rank may dispatch to: a small protocol, a catalog (priority order), and their order.

:func:`ordered` gives the candidates' order for one activation dtype (fast paths before slow ones):
the one order dispatch walks and the bring-up's L5 evidence recomputes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from .capability import ActivationDtype, Capability, OperatorSignature, Transformation
from .prepared import PreparedLinear
from .weight import RankWeight


class Kernel(Protocol):
    """A kernel: its declared capability and a load-time preparation of a rank's weight."""

    @property
    def capability(self) -> Capability:
        """What the kernel consumes and produces."""
        ...

    def prepare(self, weight: RankWeight, op: OperatorSignature) -> PreparedLinear:
        """Bring the rank's planes into the kernel's layout (raises a kernels or contract error)."""
        ...


class Catalog:
    """Kernels in priority order; ids are unique."""

    def __init__(self, kernels: Iterable[Kernel]) -> None:
        self.kernels = tuple(kernels)
        ids = [k.capability.id for k in self.kernels]
        if len(set(ids)) != len(ids):
            raise ValueError(f"kernel ids must be unique: {ids}")

    def __iter__(self) -> Iterator[Kernel]:
        return iter(self.kernels)

    @property
    def ids(self) -> tuple[str, ...]:
        """The kernel ids, in priority order."""
        return tuple(k.capability.id for k in self.kernels)


CATALOG_IDS: tuple[str, ...] = (
    "cpu.int4pack@1",
    "cpu.int4-direct@1",
    "cpu.int8pack@1",
    "cpu.gguf-direct@1",
    "cuda.int4-tinygemm@1",
    "full-dequant@1",
    "reference@1",
)
"""``id@version`` of every kernel :func:`default_catalog` holds, in its order, importable without torch:
the bring-up's driver checks ``runtime.kernels_required`` against it before anything starts (a test holds
the two equal)."""


def default_catalog() -> Catalog:
    """The kernels of this package, specialised first, the reference (oracle) last.

    The CUDA kernel follows the CPU ones: admission refuses each on the other's device, so on either
    device the specialised kernel is the first admitted; nothing CUDA runs until it is prepared.
    """
    from .gguf_kernel import GgufDirectKernel
    from .int4_cpu import Int4CpuKernel
    from .int4_cuda import Int4CudaKernel
    from .int4_direct import Int4DirectKernel
    from .int8_kernel import Int8CpuKernel
    from .reference import FullDequantKernel, ReferenceKernel

    return Catalog(
        [
            Int4CpuKernel(),
            Int4DirectKernel(),
            Int8CpuKernel(),
            GgufDirectKernel(),
            Int4CudaKernel(),
            FullDequantKernel(),
            ReferenceKernel(),
        ]
    )


#: Declared transformations of the fallback classes (:mod:`.policy`): kernels of these classes stay last
#: whatever their speed (a full-size float copy is never preferred to a packed kernel's slow path).
FALLBACK_CLASSES: tuple[Transformation, ...] = ("generic", "full-dequant")


def named(kernel: Kernel, ids: Sequence[str]) -> bool:
    """Whether ``ids`` (``id`` or ``id@version``: the manifest's preferred/required) name ``kernel``."""
    cap = kernel.capability
    return cap.id in ids or f"{cap.id}@{cap.version}" in ids


def slow_path(cap: Capability, activation_dtype: ActivationDtype) -> bool:
    """Whether the kernel runs ``activation_dtype`` on its unvectorised path (``slow_activations``)."""
    return activation_dtype in cap.slow_activations


def ordered(
    catalog: Iterable[Kernel], activation_dtype: ActivationDtype, preferred: Sequence[str] = ()
) -> tuple[Kernel, ...]:
    """The order dispatch tries the kernels in for ``activation_dtype`` (pure).

    1. the kernels ``preferred`` names (``id`` or ``id@version``; the manifest's
       ``runtime.kernels_preferred``), in its order, whatever their path;
    2. the other kernels on their fast path for the dtype, in catalog order;
    3. those on their slow path for it (:func:`slow_path`), in catalog order;
    4. the fallback classes (:data:`FALLBACK_CLASSES`: the reference, full dequant), in catalog order.

    Admission is not consulted: a kernel keeps its place whether or not it admits the operator.
    """
    kernels = tuple(catalog)
    first = [k for p in preferred for k in kernels if named(k, [p])]
    first = list(dict.fromkeys(first))  # a kernel named twice (id and id@version) once

    def tier(kernel: Kernel) -> int:
        cap = kernel.capability
        if cap.transformation in FALLBACK_CLASSES:
            return 2
        return 1 if slow_path(cap, activation_dtype) else 0

    rest = sorted((k for k in kernels if k not in first), key=tier)  # stable: catalog order within a tier
    return (*first, *rest)
