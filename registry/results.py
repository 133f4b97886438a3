"""The ``--json`` form of a command's result: its dataclass's fields, with the few it computes.

The CLI prints it with sorted keys, so field order does not matter; tuples become lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def result_json(
    result: DataclassInstance, *, skip: Collection[str] = (), **extra: object
) -> dict[str, object]:
    """Every field of ``result`` but those in ``skip`` (tuples as lists), then ``extra``."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(result):
        if f.name not in skip:
            value = getattr(result, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
    out.update(extra)
    return out
