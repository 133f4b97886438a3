"""The report a rank hands the driver after :meth:`.rank.Rank.run`, typed.

A rank returns plain data (picklable across Ray); the driver validates each report with
:func:`check_reports` before it draws evidence from it, so a rank that reports a wrong field fails
there by rank and field, not as a ``KeyError`` deep in the evidence. The evidence functions then read
the reports (checked) as mappings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import DeployError


class FullSizeBuffer(BaseModel):
    """A float buffer of at least a quantized weight's rank-local size, alive after preparation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weight: str | None
    """The weight whose operator reaches it (None: reached from elsewhere in the rank's state)."""
    where: str
    transformation: str | None
    dtype: str
    elements: int
    bytes: int


class FloatScan(BaseModel):
    """What :func:`.float_scan.scan_floats` measured on a rank."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    operators: int
    buffers: int
    smallest_elements: int
    full_size: tuple[FullSizeBuffer, ...]
    seconds: float


class RankReport(BaseModel):
    """One rank's report: what it ran, where, what it measured (the fields the evidence reads)."""

    model_config = ConfigDict(frozen=True, extra="allow", arbitrary_types_allowed=True)

    rank: int
    device: str
    activations: str
    timeline: dict[str, float]
    ledger: dict[str, int]
    dispatch: tuple[dict[str, Any], ...]
    ladders: tuple[dict[str, Any], ...]
    ladder_mode: str
    full_dequant_persistent: tuple[str, ...]
    float_buffers: FloatScan
    plan_digest: str | None
    read_amplification: float
    tiles_verified: int
    decode_seconds: float
    cache: dict[str, Any]
    tokens: tuple[int, ...]


def check_reports(reports: Sequence[Mapping[str, Any]]) -> list[RankReport]:
    """Each rank's report validated; :class:`DeployError` naming the rank and field that is wrong."""
    out = []
    for i, r in enumerate(reports):
        try:
            out.append(RankReport.model_validate(r))
        except ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(str(p) for p in first["loc"])
            raise DeployError(
                f"rank {r.get('rank', i)} reported a malformed {at!r}: {first['msg']} "
                f"(found {str(first.get('input'))[:80]!r}); the evidence cannot be drawn from it"
            ) from exc
    return out
