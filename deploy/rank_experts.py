"""Stacked expert weights ``[E, N, K]`` (GGUF ``blk.N.ffn_{gate,up,down}_exps``), one expert at a time.

The kernels take one ``[N, K]`` weight per operator (:func:`~shardport.kernels.rank_weight`). A rank
of an ep group loads the experts ``E = e0:e1`` its ep rank owns of a stacked weight, in one plane per
tensor whose first axis is the local expert (GGUF blocks: ``uint8 [e1 - e0, N_local · row_bytes]``,
rows of the rank's ``N`` slice, each of the ``K`` slice's blocks; other dtypes ``[e1 - e0, …]`` in
their own layout). :func:`split_experts` turns such a loaded group into one group per owned expert:
``name[expert e]`` with a view of the plane's row ``e - e0`` (GGUF blocks reshaped to
``[N_local, row_bytes]``, no copy) and the ``N``/``K`` bounds; :class:`ExpertWeights` gives each such
name its 2-D :class:`LogicalWeight` (the expert's shape, planes and witness cells, binding
``expert = e``). Dispatch, ladders, traces and the graph's :class:`~.graph.weights.Experts` then see
plain linear weights named ``blk.0.ffn_gate_exps.weight[expert 3]``.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator, Mapping
from typing import Any

from shardport.registry.contracts.model import (
    CELL_DIGEST_BYTES,
    CellWitness,
    LogicalShape,
    LogicalWeight,
    cell_positions,
)
from shardport.registry.families.llama import gguf_expert_stacks

from .errors import GraphWeightError

Range = tuple[int, int]
Group = tuple[dict[str, Any], dict[str, Range]]
_EXPERT = re.compile(r"(?P<stem>.+)\[expert (?P<e>[0-9]+)\]")


def expert_name(stacked: str, expert: int) -> str:
    """The name of one expert of a stacked weight: ``blk.0.ffn_gate_exps.weight[expert 3]``."""
    return f"{stacked}[expert {expert}]"


def gguf_expert_names(layer: int, expert: int) -> tuple[str, str, str]:
    """The gate, up and down weights of one expert of a GGUF MoE layer (views of ``ffn_*_exps``)."""
    gate, up, down = (expert_name(stacked, expert) for stacked in gguf_expert_stacks(layer))
    return gate, up, down


def parse_expert_name(name: str) -> tuple[str, int] | None:
    """``(stacked weight, expert)`` of an :func:`expert_name`; None for any other name."""
    m = _EXPERT.fullmatch(name)
    return (m["stem"], int(m["e"])) if m is not None else None


def _expert_witness(witness: Any, expert: int) -> CellWitness | None:
    """The witness cells of one expert (the stacked digests hold every expert's cells in turn)."""
    if not isinstance(witness, CellWitness):
        return None  # a row witness of a stacked weight names rows of no single expert: none to check
    size = len(cell_positions(witness)) * CELL_DIGEST_BYTES
    raw = base64.b64decode(witness.digests, validate=True)[expert * size : (expert + 1) * size]
    return CellWitness.model_validate(
        witness.model_dump() | {"experts": 1, "digests": base64.b64encode(raw).decode("ascii")}
    )


def expert_weight(weight: LogicalWeight, expert: int) -> LogicalWeight:
    """The 2-D ``[N, K]`` logical weight of expert ``expert`` of a stacked ``[E, N, K]`` weight."""
    if weight.shape.axes != ("E", "N", "K"):
        raise GraphWeightError(f"weight {weight.name}: axes {weight.shape.axes}, expected stacked (E, N, K)")
    count, n, k = weight.shape.extents
    if not 0 <= expert < count:
        raise GraphWeightError(f"weight {weight.name}: expert {expert} outside 0..{count - 1}")
    planes = tuple(
        p.model_copy(update={"shape": p.shape[1:]}) if p.shape[:1] == (count,) else p for p in weight.planes
    )
    return weight.model_copy(
        update={
            "name": expert_name(weight.name, expert),
            "shape": LogicalShape(axes=("N", "K"), extents=(n, k)),
            "planes": planes,
            "binding": weight.binding.model_copy(update={"expert": expert}),
            "witness": _expert_witness(weight.witness, expert),
        }
    )


class ExpertWeights(Mapping[str, LogicalWeight]):
    """The manifest's weights by name, plus each stacked weight's experts by :func:`expert_name`."""

    def __init__(self, weights: Mapping[str, LogicalWeight]) -> None:
        self.base = weights
        self._views: dict[str, LogicalWeight] = {}

    def __getitem__(self, name: str) -> LogicalWeight:
        if name in self.base:
            return self.base[name]
        if name not in self._views:
            parsed = parse_expert_name(name)
            if parsed is None or parsed[0] not in self.base:
                raise KeyError(name)
            self._views[name] = expert_weight(self.base[parsed[0]], parsed[1])
        return self._views[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)


def with_experts(weights: Mapping[str, LogicalWeight]) -> Mapping[str, LogicalWeight]:
    """``weights`` that also resolve expert names (idempotent)."""
    return weights if isinstance(weights, ExpertWeights) else ExpertWeights(weights)


def _expert_plane(tensor: str, array: Any, local: int, experts: int, rows: int) -> Any:
    """Row ``local`` of a stacked plane: a view, GGUF blocks as ``[rows, row_bytes]``."""
    if array.ndim < 2 or array.shape[0] != experts:
        raise GraphWeightError(
            f"tensor {tensor}: loaded shape {list(array.shape)}, expected the rank's {experts} experts first"
        )
    view = array[local]
    return view.reshape(rows, -1) if view.ndim == 1 else view


def split_experts(groups: Mapping[str, Group]) -> dict[str, Group]:
    """Each group whose bounds have an ``E`` axis, as one group per owned expert (views, no copies)."""
    out: dict[str, Group] = {}
    for name, (planes, bounds) in groups.items():
        if "E" not in bounds:
            out[name] = (planes, bounds)
            continue
        e0, e1 = bounds["E"]
        rest = {axis: b for axis, b in bounds.items() if axis != "E"}
        n0, n1 = rest.get("N", (0, 0))
        for local, expert in enumerate(range(e0, e1)):
            views = {t: _expert_plane(t, a, local, e1 - e0, n1 - n0) for t, a in planes.items()}
            out[expert_name(name, expert)] = (views, dict(rest))
    return out
