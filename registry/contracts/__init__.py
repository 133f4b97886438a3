"""Numeric contracts: what a quantized checkpoint's bytes mean, made explicit and checked.

Consumes a checkpoint's config and tensor inventory (names, dtypes, shapes) and, where values are
needed, the planes as numpy arrays. Produces, per logical weight, a :class:`LogicalWeight` (contract,
graph binding, planes by role, decode witness), reference decodes in binary32, gate reports, and
typed refusals (:mod:`.errors`). numpy only; no torch.

- :mod:`.model` — the frozen contract models;
- :mod:`.infer` — contracts from config + inventory (+ ``--declare``);
- :mod:`.gates` — semantic gates;
- :mod:`.decode` — reference decoders (the kernels' oracle);
- :mod:`.witness` — decode witnesses (cells every rank meets);
- :mod:`.rounding` — the honest rounding bound of each element, and the reference gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardport._lazy import lazy_exports

if TYPE_CHECKING:
    from .declare import DeclareSpec, parse_declare
    from .decode import decode_weight
    from .gates import GateReport, check_contract, check_inventory, check_values, run_gates
    from .infer import infer_gguf, infer_safetensors
    from .model import (
        AffineIntContract,
        CellWitness,
        Contract,
        DecodeWitness,
        FloatContract,
        GgufBlockContract,
        GraphBinding,
        LogicalShape,
        LogicalWeight,
        PlaneRef,
        TensorInfo,
    )
    from .rounding import reference_gate
    from .witness import check_cells, check_witness, compare_witness, make_witness

#: Where each exported name lives. Imported on first use, so that reading a manifest (which needs
#: only :mod:`.model`) does not load numpy, the decoders and the container gates.
_HOME = {
    **dict.fromkeys(("DeclareSpec", "parse_declare"), "declare"),
    "decode_weight": "decode",
    **dict.fromkeys(
        ("GateReport", "check_contract", "check_inventory", "check_values", "run_gates"), "gates"
    ),
    **dict.fromkeys(("infer_gguf", "infer_safetensors"), "infer"),
    **dict.fromkeys(
        (
            "AffineIntContract",
            "CellWitness",
            "Contract",
            "DecodeWitness",
            "FloatContract",
            "GgufBlockContract",
            "GraphBinding",
            "LogicalShape",
            "LogicalWeight",
            "PlaneRef",
            "TensorInfo",
        ),
        "model",
    ),
    "reference_gate": "rounding",
    **dict.fromkeys(("check_cells", "check_witness", "compare_witness", "make_witness"), "witness"),
}


__getattr__ = lazy_exports(__name__, globals(), _HOME)


__all__ = [
    "AffineIntContract",
    "CellWitness",
    "Contract",
    "DeclareSpec",
    "DecodeWitness",
    "FloatContract",
    "GateReport",
    "GgufBlockContract",
    "GraphBinding",
    "LogicalShape",
    "LogicalWeight",
    "PlaneRef",
    "TensorInfo",
    "check_cells",
    "check_contract",
    "check_inventory",
    "check_values",
    "check_witness",
    "compare_witness",
    "decode_weight",
    "infer_gguf",
    "infer_safetensors",
    "make_witness",
    "parse_declare",
    "reference_gate",
    "run_gates",
]
