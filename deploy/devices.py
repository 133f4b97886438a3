"""Where a rank runs and how ranks talk: the placement bundle, the rank's device, the collective backend.

The choices are pure functions of what was observed, so they are tested without a GPU:

- :func:`bundle_spec` — cluster resources → one rank's placement-group bundle: ``{"GPU": 1}`` (and up to
  one CPU) when the cluster has a GPU for every rank, else a share of the CPUs (a 2-core machine could
  not otherwise place four ranks; asking for a GPU the cluster lacks would wait forever).
- :func:`rank_device` — the CUDA devices the rank's process sees (Ray hands a rank with a GPU bundle
  exactly its GPU through ``CUDA_VISIBLE_DEVICES``) and the devices the runtime graph runs on → the
  rank's :class:`RankDevice`.
- :func:`backend_for` — the device kind → the torch.distributed backend: NCCL on CUDA, gloo on the CPU.
- :func:`kernel_device` — the rank's device → the :class:`~shardport.kernels.Device` the kernels'
  admission checks (the CPU's ISA, or the CUDA device's compute capability).

What touches the hardware is small and named: :func:`visible_cuda` (names of the CUDA devices torch
sees) and :func:`device_memory` (``torch.cuda.memory_allocated`` / ``max_memory_allocated``). Neither
initialises CUDA on a machine without it. The runtime graph runs on the CPU and on CUDA
(:data:`GRAPH_DEVICES`): a rank that sees a CUDA device computes there (:func:`torch_device` is what the
graph is given: its activations, float weights, KV cache and collectives' buffers live there; NCCL; the
device ledger), a rank that sees none computes on the CPU with gloo. On a CUDA rank the kernels'
admission sees the CUDA device: CPU-only kernels (int4pack, int8, gguf-direct) are refused there, and a
weight no CUDA kernel takes is refused, or runs through the reference kernels where the fallback policy
allows a full dequantization (on the device, never silently on the CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

    from shardport.kernels import Device

Backend = Literal["gloo", "nccl"]
DeviceKind = Literal["cpu", "cuda"]

#: The devices the runtime graph can compute on (every tensor it makes follows the rank's device).
GRAPH_DEVICES: tuple[DeviceKind, ...] = ("cpu", "cuda")


def bundle_spec(gpus: int, cpus: float, world: int) -> dict[str, float]:
    """One rank's resources: a whole GPU where the cluster has one for every rank, else a CPU share."""
    if world < 1:
        raise ValueError(f"world size {world}: expected at least 1")
    if gpus >= world:
        return {"GPU": 1.0, "CPU": min(1.0, cpus / world)}
    return {"CPU": max(0.01, min(1.0, cpus / world))}


def backend_for(kind: DeviceKind) -> Backend:
    """The torch.distributed backend of ranks computing on ``kind``: NCCL on CUDA, gloo on the CPU."""
    return "nccl" if kind == "cuda" else "gloo"


@dataclass(frozen=True)
class RankDevice:
    """The device a rank computes on: the CPU, or a CUDA device (its index in the process and name)."""

    kind: DeviceKind
    index: int | None = None
    name: str = ""

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index} {self.name}".rstrip()

    @property
    def backend(self) -> Backend:
        """The collective backend of this device (:func:`backend_for`)."""
        return backend_for(self.kind)


def rank_device(visible: Sequence[str], graph_devices: Sequence[DeviceKind] = GRAPH_DEVICES) -> RankDevice:
    """The rank's device: its first visible CUDA device when the graph runs on CUDA, else the CPU.

    ``visible``: the names of the CUDA devices the rank's process sees (in index order).
    """
    if visible and "cuda" in graph_devices:
        return RankDevice("cuda", 0, visible[0])
    return RankDevice("cpu")


def torch_device(device: RankDevice) -> torch.device:
    """The ``torch.device`` the rank's graph runs on: ``cpu``, or ``cuda:<index>``."""
    import torch

    return torch.device("cpu") if device.kind == "cpu" else torch.device("cuda", device.index or 0)


def kernel_device(device: RankDevice) -> Device:
    """The device the kernels' admission checks for ``device`` (a CUDA device torch cannot use: refused)."""
    from shardport.kernels import cuda_device, this_cpu

    from .errors import ClusterError

    if device.kind == "cpu":
        return this_cpu()
    found = cuda_device(device.index)
    if found is None:
        raise ClusterError(f"{device}: torch cannot use this CUDA device in the rank's process")
    return found


def visible_cuda() -> list[str]:
    """Names of the CUDA devices torch sees in this process; none without a CUDA build or device."""
    import torch

    try:
        if not torch.cuda.is_available():
            return []
        return [str(torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]
    except (RuntimeError, AssertionError):  # a CUDA build without a usable driver
        return []


def device_memory(device: RankDevice) -> tuple[int, int]:
    """(resident, peak) bytes torch allocated on the rank's device; (0, 0) on the CPU (no device memory)."""
    if device.kind == "cpu":
        return 0, 0
    import torch

    return int(torch.cuda.memory_allocated(device.index)), int(torch.cuda.max_memory_allocated(device.index))
