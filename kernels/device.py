"""The device a kernel runs on: the CPU and the ISA torch dispatches to, or a CUDA device and its cc."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class Device(BaseModel):
    """``kind`` cpu (``isa``: torch's CPU capability, e.g. ``AVX512``) or cuda (``cc``: (major, minor))."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["cpu", "cuda"]
    isa: str | None = None
    cc: tuple[int, int] | None = None

    def __str__(self) -> str:
        if self.kind == "cpu":
            return f"cpu/{self.isa}"
        return f"cuda/sm{self.cc[0]}{self.cc[1]}" if self.cc else "cuda"


def cpu_isa() -> str:
    """The CPU ISA torch dispatches its vectorized kernels to now (``AVX512``, ``AVX2``, ``DEFAULT``)."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def this_cpu() -> Device:
    """Describe the CPU of this process, with the ISA torch dispatches to."""
    return Device(kind="cpu", isa=cpu_isa())


def cuda_device(index: int | None = None) -> Device | None:
    """The CUDA device torch would run on (``index``: which one; the current one when None), or None.

    None when torch has no CUDA build or sees no device; never raises. Calling it initialises CUDA
    (``torch.cuda.get_device_capability``), so it is called at dispatch time, never at import.
    """
    import torch

    try:
        if not torch.cuda.is_available():
            return None
        at = torch.cuda.current_device() if index is None else index
        major, minor = torch.cuda.get_device_capability(at)
    except (RuntimeError, AssertionError):  # a CUDA build without a usable driver
        return None
    return Device(kind="cuda", cc=(int(major), int(minor)))
