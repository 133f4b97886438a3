"""The parity ladder's budget on a rank (``registry up --ladder full|sample|off``), as pure logic.

- ``full``: every prepared operator runs L0-L3 (every level on every weight).
- ``sample`` (the default): every operator runs L0, L1 (every code read back -- through int4pack's
  byte map learnt from torch's converter, with 64 spot columns of every row read by the kernel, the
  class representative's full ladder holding the whole map to the kernel; through the kernel for other
  layouts -- against the planes' codes) and
  the L2 witness comparison (the manifest's witness rows or cells inside the slice, re-decoded from
  the rank's planes); the L2 full reconstruction and L3's operator error run on one representative
  per *ladder class* — the first operator of the class by weight name on the rank.
  A class is what decides the kernel's code path for a weight: the kernel id and version, the
  transformation, the phases the operator serves, the operator signature's representation fields (the
  layout id, code encoding and bits, scale format/sign/levels, zero-point kind, group size and axis,
  act order, permutation, tail group, decode law, GGUF type, activation dtype, device), and the shape
  residues a kernel's tiling sees: ``n_local`` and ``k_local`` modulo :data:`TILE`, and ``col_start``
  modulo the group (block) size. A sampled weight is proved only together with its representative's
  ladder (see :mod:`.up_evidence`).
- ``off``: no L0-L3 at all; the evidence says the levels were not run.

``True``/``False`` (the former ``ladder=`` flag) mean ``full``/``off``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from shardport.kernels import PreparedLinear

LadderMode = Literal["full", "sample", "off"]
MODES: tuple[LadderMode, ...] = ("full", "sample", "off")
#: The residues of the local extents a class keeps apart: SIMD tiles and blocks are powers of two up to
#: 64 elements in the kernels here (int4pack's N blocks, the GGUF direct kernel's 32/256-element blocks
#: divide or are divided by it), so equal residues mean the same tail handling.
TILE = 64
_SHAPE_FIELDS = frozenset({"weight", "n_local", "k_local", "row_start", "col_start", "phase"})


def ladder_mode(value: str | bool) -> LadderMode:
    """``--ladder MODE`` (or the former boolean flag) as a mode; ValueError for anything else."""
    if value is True:
        return "full"
    if value is False:
        return "off"
    for mode in MODES:
        if value == mode:
            return mode
    raise ValueError(f"--ladder {value!r}: expected full, sample or off")


def ladder_class(op: PreparedLinear, phases: Iterable[str]) -> str:
    """The class key of a prepared operator serving ``phases`` (see the module docstring).

    Readable parts (kernel, transformation, phases, layout id, shape residues) and the first 16 hex
    digits of the SHA-256 of the signature's other representation fields (canonical JSON).
    """
    sig = op.op
    fields = sig.model_dump(mode="json", exclude=set(_SHAPE_FIELDS))
    group = sig.group_size or 1
    shape = f"n%{TILE}={sig.n_local % TILE},k%{TILE}={sig.k_local % TILE},k0%{group}={sig.col_start % group}"
    rep = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return f"{op.kernel}|{op.transformation}|{'+'.join(sorted(phases))}|{sig.layout}|{shape}|{rep}"


@dataclass(frozen=True)
class Planned:
    """One operator's ladder under the budget: its class and the weight (name) that represents it."""

    weight: str
    op: PreparedLinear
    ladder_class: str
    representative: str | None
    """None: this operator runs the full ladder; else the weight name whose full ladder covers it."""


def plan_ladders(
    operators: Sequence[tuple[str, PreparedLinear, Sequence[str]]], mode: LadderMode
) -> list[Planned]:
    """Which operators run the full ladder: all (``full``), none (``off``), the first per class (``sample``).

    ``operators``: (weight name, operator, the phases it serves), in any order; the representative of a
    class is the first by weight name (then by kernel), so the choice is deterministic.
    """
    if mode == "off":
        return []
    seen: dict[str, str] = {}
    out = []
    for name, op, phases in sorted(operators, key=lambda t: (t[0], t[1].kernel)):
        key = ladder_class(op, phases)
        if mode == "full" or key not in seen:
            seen.setdefault(key, name)
            out.append(Planned(name, op, key, None))
        else:
            out.append(Planned(name, op, key, seen[key]))
    return out
