"""The kernels a rank may dispatch to: a small protocol and an ordered catalog (priority order)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from .capability import Capability, OperatorSignature
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
