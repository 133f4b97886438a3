"""Make the kernel case builders (``kernel_cases``) importable by the kernels tests."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
