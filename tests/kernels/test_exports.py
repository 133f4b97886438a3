"""The kernels package face: every exported name resolves; importing it loads neither torch nor a kernel."""

from __future__ import annotations

import subprocess
import sys

import shardport.kernels as kernels


def test_every_exported_name_resolves() -> None:
    assert kernels.__doc__ and len(kernels.__doc__.strip().splitlines()) > 3
    assert sorted(kernels.__all__) == sorted(kernels._HOME)
    for name in kernels.__all__:
        assert getattr(kernels, name) is not None, name
    assert callable(kernels.dispatch) and callable(kernels.ladder)  # functions, not same-named modules


def test_importing_the_package_is_lazy() -> None:
    code = (
        "import sys, shardport.kernels; "
        "print(sorted(m for m in sys.modules if m.startswith('shardport.kernels.') or m == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
