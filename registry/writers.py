"""The one way shardport writes a safetensors file.

Contiguous buffers, reopened and compared, then renamed into place (``safetensors.numpy.save_file``
silently scrambles non-contiguous arrays).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardport.registry.errors import VerificationError


def write_safetensors(
    arrays: Mapping[str, npt.NDArray[Any]], out: Path, metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``arrays`` to ``out``; publish only if every tensor reads back exactly.

    Every name, dtype, shape and byte is compared after reopening the written file.
    """
    from safetensors.numpy import load_file, save_file

    contiguous = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    try:
        save_file(contiguous, tmp, metadata=dict(metadata) if metadata else None)
        back = load_file(tmp)
        if set(back) != set(contiguous):
            raise VerificationError(f"{out}: holds {sorted(back)} after writing {sorted(contiguous)}")
        for name, array in contiguous.items():
            got = back[name]
            if got.dtype != array.dtype or got.shape != array.shape or got.tobytes() != array.tobytes():
                raise VerificationError(f"{out}: tensor {name} does not read back as written")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
