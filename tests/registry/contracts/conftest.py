"""Shared builders for the numeric-contract tests (defined in ``tests/quantized.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from quantized import (
    AWQ_ORDER,
    awq_planes,
    expected_decode,
    gptq_planes,
    inventory,
    make_quantized,
    pack_along_columns,
    pack_along_rows,
)


@pytest.fixture
def build() -> SimpleNamespace:
    """The builders above, as one namespace (conftest modules are not importable by tests)."""
    return SimpleNamespace(
        pack_along_rows=pack_along_rows,
        pack_along_columns=pack_along_columns,
        expected_decode=expected_decode,
        make_quantized=make_quantized,
        gptq_planes=gptq_planes,
        awq_planes=awq_planes,
        inventory=inventory,
        AWQ_ORDER=AWQ_ORDER,
    )
