"""Kernel tests: the case builders (``kernel_cases``) are importable, and torch runs single-threaded.

On the shared 2-core CI machine, two OpenMP threads under load stall at every parallel region's
barrier (10-30x slower for the many small ops of a tile decoder); results do not depend on the
thread count, so the tests pin one thread and restore the setting afterwards.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
