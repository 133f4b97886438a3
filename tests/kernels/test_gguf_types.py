"""The torch-free GGUF type lists (read by the kernel's capability at push) match the decoders."""

from __future__ import annotations

import subprocess
import sys

from shardport.kernels import gguf_direct
from shardport.kernels.gguf_types import GGUF_DIRECT_TYPES, NATIVE_TYPES, VIA_GGUF


def test_the_native_list_names_exactly_the_torch_decoders() -> None:
    assert frozenset(gguf_direct._NATIVE) == NATIVE_TYPES
    assert GGUF_DIRECT_TYPES == NATIVE_TYPES | frozenset(VIA_GGUF) and "MXFP4" in GGUF_DIRECT_TYPES


def test_the_catalogue_capabilities_load_without_torch() -> None:
    """Push computes the runtime layer over the catalogue: its capabilities import no torch."""
    code = (
        "import sys; from shardport.kernels import default_catalog; "
        "ids = [k.capability.id for k in default_catalog()]; "
        "print(len(ids) > 0, 'torch' in sys.modules)"
    )
    run = [sys.executable, "-c", code]
    out = subprocess.run(run, capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr
