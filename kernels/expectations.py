"""The ``runtime`` layer push pins: per weight class and device class, the kernel admission expects.

Pure (manifest in, section out; no torch, no I/O): every weight a kernel runs (affine integer codes,
GGUF blocks other than the float types — what bring-up dispatches) is described by the operator
signature of the whole weight (tp = 1; a stacked ``[E, N, K]`` weight by one expert's ``[N, K]``), for
each :data:`DEVICE_CLASSES` entry, and walked in :func:`.catalog.ordered`'s order with
:func:`.admission.admit` and the default :class:`.policy.FallbackPolicy`, as dispatch walks them. A
bfloat16 class falls back to float32 where bring-up does (no kernel takes bfloat16, or a kernel ranked
before the selected one refuses bfloat16 alone and is fast in float32; the output head keeps float32).

The result names the runtime (``shardport`` and its version) and the catalogue (``id@version``) it was
computed against, so the same files give the same digest on every machine with the same shardport:
nothing here depends on the host (torch's build, the CPU's ISA, a GPU's presence). CPU classes are
evaluated at ISA ``DEFAULT`` (what every CPU build dispatches to), CUDA at sm80.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import shardport
from shardport.registry.artifact.manifest import ExpectedKernel, Manifest, RuntimeInfo
from shardport.registry.contracts.model import (
    AffineIntContract,
    FloatContract,
    GgufBlockContract,
    LogicalWeight,
)
from shardport.registry.families.llama import HEAD_SLOTS as _HEAD_SLOTS

from .admission import Reason, admit
from .capability import ActivationDtype, OperatorSignature, operator_signature
from .catalog import Catalog, Kernel, default_catalog, named, ordered, slow_path
from .device import Device
from .policy import FallbackPolicy
from .slice_admission import first_admitted
from .weight import RankWeight

RUNTIME = "shardport"
DEVICE_CLASSES: dict[str, tuple[Device, ActivationDtype]] = {
    "cpu/float32": (Device(kind="cpu", isa="DEFAULT"), "float32"),
    "cpu/bfloat16": (Device(kind="cpu", isa="DEFAULT"), "bfloat16"),
    "cuda-sm80/bfloat16": (Device(kind="cuda", cc=(8, 0)), "bfloat16"),
}
"""The device classes the runtime layer pins: name -> (device admission sees, activation dtype)."""
FLOAT_GGUF = frozenset({"F32", "F16", "BF16"})
HEAD_SLOTS = _HEAD_SLOTS
"""Slots whose operator keeps float32 activations in a bfloat16 run (the head, or its tied embedding)."""


def dispatched(weight: LogicalWeight) -> bool:
    """Whether bring-up runs the weight through a kernel (others are decoded to float)."""
    c = weight.contract
    if len(weight.shape.extents) < 2:
        return False
    if isinstance(c, AffineIntContract):
        return True
    return isinstance(c, GgufBlockContract) and c.ggml_type not in FLOAT_GGUF


def whole_weight(weight: LogicalWeight) -> RankWeight:
    """The weight as one rank holds it at tp = 1 (no planes: admission reads the contract and extents)."""
    c = weight.contract
    if not isinstance(c, FloatContract | AffineIntContract | GgufBlockContract):
        raise TypeError(f"{weight.name}: a {c.family} contract is decoded to float, not run by a kernel")
    n, k = weight.shape.extents[-2:]
    return RankWeight(weight=weight, contract=c, n_local=n, k_local=k, row_start=0, col_start=0, planes={})


def weight_class(op: OperatorSignature) -> str:
    """The class of an operator: the representation fields admission compares, as one string.

    ``gguf:Q4_0``; ``affine:u4:slots32@K:KN:01234567/g128/zero=int_plane/minus_one/act_order``.
    Bring-up's traces give the same string for their ``requested`` signature.
    """
    parts = [op.layout]
    if op.layout.startswith("affine:"):
        parts += [f"g{op.group_size}", f"scale={op.scale_format}", f"zero={op.zero_point}"]
        parts += [flag for flag, on in (("act_order", op.act_order), ("perm", op.permutation)) if on]
    if op.tail_group:
        parts.append("tail")
    return "/".join(parts)


def _first(
    op: OperatorSignature, kernels: Sequence[Kernel], policy: FallbackPolicy, required: Sequence[str]
) -> Kernel | None:
    return first_admitted(op, kernels, policy, required)[0]


def _dtype_only_ahead(
    op: OperatorSignature, kernels: Sequence[Kernel], chosen: Kernel, required: Sequence[str]
) -> bool:
    """A kernel ranked before ``chosen`` refuses ``op`` for its activation dtype alone, fast in float32."""
    for kernel in kernels:
        if kernel is chosen:
            return False
        if required and not named(kernel, required):
            continue
        reasons = admit(op, kernel.capability).reasons
        if (
            reasons
            and set(reasons) == {Reason.ACTIVATION_DTYPE}
            and not slow_path(kernel.capability, "float32")
        ):
            return True
    return False


def expected(
    weight: LogicalWeight,
    device: Device,
    activations: ActivationDtype,
    catalog: Catalog,
    *,
    policy: FallbackPolicy,
    preferred: Sequence[str] = (),
    required: Sequence[str] = (),
) -> tuple[str, str | None, ActivationDtype]:
    """(weight class, ``id@version`` or None, the activations it runs) for the whole ``weight``."""
    rw = whole_weight(weight)
    wanted: ActivationDtype = "float32" if weight.binding.slot in HEAD_SLOTS else activations
    op = operator_signature(rw, wanted, "decode", device)
    cls = weight_class(op)
    order = ordered(catalog, wanted, preferred)
    chosen = _first(op, order, policy, required)
    if wanted != "float32" and (chosen is None or _dtype_only_ahead(op, order, chosen, required)):
        op32 = operator_signature(rw, "float32", "decode", device)
        fallback = _first(op32, ordered(catalog, "float32", preferred), policy, required)
        if fallback is not None:  # nothing admits either dtype: the class's own dtype is reported
            chosen, wanted = fallback, "float32"
    name = f"{chosen.capability.id}@{chosen.capability.version}" if chosen is not None else None
    return cls, name, wanted


def expected_kernels(
    weights: Iterable[LogicalWeight],
    catalog: Catalog,
    *,
    policy: FallbackPolicy | None = None,
    preferred: Sequence[str] = (),
    required: Sequence[str] = (),
) -> list[ExpectedKernel]:
    """Per (weight class, device class, activations run) the kernel expected, and how many weights.

    One entry per weight where the weights of one such key expect different kernels (a shape multiple
    one of them misses).
    """
    policy = policy or FallbackPolicy()
    found: dict[tuple[str, str, str], list[tuple[str, str | None]]] = defaultdict(list)
    for w in weights:
        if not dispatched(w):
            continue
        for device_name, (device, dtype) in DEVICE_CLASSES.items():
            cls, kernel, ran = expected(
                w, device, dtype, catalog, policy=policy, preferred=preferred, required=required
            )
            found[(cls, device_name, ran)].append((w.name, kernel))
    out: list[ExpectedKernel] = []
    for (cls, device_name, runs), rows in sorted(found.items()):
        key = {"weight_class": cls, "device": device_name, "activations": runs}
        kernels = {kernel for _, kernel in rows}
        if len(kernels) == 1:
            out.append(ExpectedKernel(**key, kernel=kernels.pop(), weights=len(rows)))
            continue
        out += [ExpectedKernel(**key, kernel=k, weights=1, weight=name) for name, k in sorted(rows)]
    return out


def runtime_layer(manifest: Manifest, catalog: Catalog | None = None) -> RuntimeInfo:
    """``manifest``'s runtime section with the runtime, the catalogue and the expected kernels filled.

    The kernel ids ``push --kernels-required/--kernels-preferred`` recorded are kept and steer the
    expectations as they steer dispatch.
    """
    catalog = catalog or default_catalog()
    rt = manifest.runtime
    return rt.model_copy(
        update={
            "name": RUNTIME,
            "tested_version": shardport.__version__,
            "catalogue": [f"{k.capability.id}@{k.capability.version}" for k in catalog],
            "expected_kernels": expected_kernels(
                manifest.weights or (),
                catalog,
                preferred=rt.kernels_preferred,
                required=rt.kernels_required,
            ),
        }
    )


def pinned_kernel(
    runtime: RuntimeInfo, weight: str, op: OperatorSignature, device: str
) -> ExpectedKernel | None:
    """The pinned expectation for a bring-up trace, if the manifest pins one.

    ``weight``: the trace's logical weight name; ``op``: its ``requested`` signature (whose activation
    dtype is the one the operator ran); ``device``: the run's device class (a :data:`DEVICE_CLASSES`
    name). For L5 to compare against the manifest's pins instead of recomputing them; an entry naming the
    weight wins over its class's. The pins are for the whole weight (tp = 1): a slice whose extents miss
    a kernel's multiple (tp > 1) may select another kernel; None where the manifest pins nothing.
    """
    cls = weight_class(op)
    rows = [
        e
        for e in runtime.expected_kernels or ()
        if e.weight_class == cls and e.device == device and e.activations == op.activation_dtype
    ]
    for e in sorted(rows, key=lambda e: e.weight != weight):  # an entry naming the weight first
        if e.weight in (weight, None):
            return e
    return None
