"""The package exports a small, importable public surface and no torch."""

from __future__ import annotations

import subprocess
import sys

import shardport.registry.contracts as contracts


def test_exported_names_exist():
    assert sorted(contracts.__all__) == sorted(set(contracts.__all__))
    for name in contracts.__all__:
        assert getattr(contracts, name) is not None


def test_contracts_do_not_import_torch():
    code = "import sys, shardport.registry.contracts; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
