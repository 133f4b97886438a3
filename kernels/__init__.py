"""shardport.kernels: which real kernel runs each rank's quantized linear operator, and proof it is right.

Consumes a rank's planes as the loader returns them, described by a :class:`RankWeight`
(:func:`rank_weight`: the manifest's logical weight, the arrays by tensor name, the logical slice), and
the registry's contracts and reference decoders (the oracle). Produces, per weight, rank and phase, a
:class:`PreparedLinear` (the planes repacked or mapped at load time into the selected kernel's layout;
ISA-keyed and never persisted) with a :class:`DispatchTrace` (every candidate accepted or
refused-because, the selection, the transformation) and the parity :class:`Ladder` L0-L3, all plain
data for signed evidence. Imports the registry and provenance only; torch is imported where a kernel
runs.

- :func:`admit` — the pure admission predicate over (:class:`OperatorSignature`, :class:`Capability`);
- :func:`dispatch` — selection under a :class:`FallbackPolicy` (full dequant forbidden by default);
  :func:`dispatch_activations` — the same in a requested activation dtype, with the float32 fallback
  said in the traces;
- :func:`ladder` — parity levels 0-3; :func:`default_catalog` — the kernels in priority order
  (CPU, then CUDA: optional, nothing CUDA at import); :func:`ordered` — the order dispatch tries them
  in for an activation dtype (fast paths before slow ones);
- :func:`cuda_device` / :func:`this_cpu` — the device to dispatch for;
- errors: :class:`KernelError` and its subclasses (:mod:`.errors` draws the tree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardport._lazy import lazy_exports

if TYPE_CHECKING:
    from .activations import dispatch_activations, note_float32
    from .admission import Admission, Reason, Refusal, admit
    from .capability import Capability, OperatorSignature, layout_id, operator_signature
    from .catalog import Catalog, Kernel, default_catalog, named, ordered
    from .device import Device, cuda_device, this_cpu
    from .errors import KernelError, NoAdmissibleKernelError
    from .parity import Ladder, ladder, ladder_sampled, require
    from .policy import FallbackPolicy
    from .prepared import PreparedLinear
    from .selection import DispatchTrace, FallbackWarning, dispatch, dispatch_phases
    from .weight import RankWeight, rank_weight

_HOME = {
    **dict.fromkeys(("dispatch_activations", "note_float32"), "activations"),
    **dict.fromkeys(("Admission", "Reason", "Refusal", "admit"), "admission"),
    **dict.fromkeys(("Capability", "OperatorSignature", "layout_id", "operator_signature"), "capability"),
    **dict.fromkeys(("Catalog", "Kernel", "default_catalog", "named", "ordered"), "catalog"),
    **dict.fromkeys(("Device", "cuda_device", "this_cpu"), "device"),
    **dict.fromkeys(("DispatchTrace", "FallbackWarning", "dispatch", "dispatch_phases"), "selection"),
    **dict.fromkeys(("KernelError", "NoAdmissibleKernelError"), "errors"),
    **dict.fromkeys(("Ladder", "ladder", "ladder_sampled", "require"), "parity"),
    "FallbackPolicy": "policy",
    "PreparedLinear": "prepared",
    **dict.fromkeys(("RankWeight", "rank_weight"), "weight"),
}

__getattr__ = lazy_exports(__name__, globals(), _HOME)

__all__ = [
    "Admission",
    "Capability",
    "Catalog",
    "Device",
    "DispatchTrace",
    "FallbackPolicy",
    "FallbackWarning",
    "Kernel",
    "KernelError",
    "Ladder",
    "NoAdmissibleKernelError",
    "OperatorSignature",
    "PreparedLinear",
    "RankWeight",
    "Reason",
    "Refusal",
    "admit",
    "cuda_device",
    "default_catalog",
    "dispatch",
    "dispatch_activations",
    "dispatch_phases",
    "ladder",
    "ladder_sampled",
    "layout_id",
    "named",
    "note_float32",
    "operator_signature",
    "ordered",
    "rank_weight",
    "require",
    "this_cpu",
]
