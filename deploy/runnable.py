"""Before anything starts: whether a kernel runs every weight on the ranks' device class.

The manifest's ``runtime.expected_kernels`` (pinned at push by admission over the catalogue, under the
default fallback policy and ``runtime.kernels_required``) says, per weight class and device class, which
kernel a whole weight gets; ``None`` there means nothing admits it. On the embedded default cluster the
driver knows the ranks' device class before Ray starts: the CPU (in the run's activation dtype) where
this host has no GPU. A pin of ``None`` for that class then fails every rank at dispatch after the whole
load, unless ``--fallback allow`` lets the generic kernels in: :func:`check_runnable` refuses it at once,
naming the weight classes. Elsewhere (``--address``, a host with GPUs, a manifest without pins) the
ranks' dispatch decides, as before. Pure apart from :func:`host_has_gpu`, and without torch.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import shardport
from shardport.kernels.catalog import CATALOG_IDS
from shardport.registry.artifact.manifest import Manifest

from .errors import UnsupportedModelError


def host_has_gpu() -> bool:
    """Whether a rank started on this host could see an NVIDIA GPU (device nodes, unless hidden)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def embedded_device_class(activations: str, *, gpu: bool) -> str | None:
    """The device class the embedded default's ranks run (None: they may take a GPU; unknown here)."""
    if gpu:
        return None
    return "cpu/bfloat16" if activations == "bfloat16" else "cpu/float32"


def pinned_here(manifest: Manifest) -> bool:
    """Whether the manifest's push-time layers were computed by this shardport with this catalogue.

    Pins and degrees from another version (a kernel added since, a planner relaxed) are not held
    against a request: the ranks' own dispatch and the plan-time checks decide then.
    """
    runtime = manifest.runtime
    return (
        runtime.name == "shardport"
        and runtime.tested_version == shardport.__version__
        and runtime.catalogue == list(CATALOG_IDS)
    )


def check_runnable(manifest: Manifest, device_class: str | None, fallback: str) -> None:
    """Refuse (:class:`UnsupportedModelError`, exit 5) weights no kernel admits on ``device_class``."""
    pins = manifest.runtime.expected_kernels
    if device_class is None or not pins or fallback == "allow" or not pinned_here(manifest):
        return
    missing = [p for p in pins if p.device == device_class and p.kernel is None]
    if not missing:
        return
    classes = "; ".join(
        f"{p.weight_class} ({p.weights} weight{'s' if p.weights != 1 else ''}"
        + (f", e.g. {p.weight}" if p.weight else "")
        + ")"
        for p in missing
    )
    required = manifest.runtime.kernels_required
    why = f" with runtime.kernels_required {required}" if required else ""
    raise UnsupportedModelError(
        f"no kernel of this shardport admits {classes} on {device_class}{why} under --fallback {fallback} "
        "(the manifest's runtime layer, computed at push): every rank would load its bytes and then "
        "refuse them. Push again with --kernels-required naming a kernel for this device, run on a "
        "device that has one, or pass --fallback allow to run them through the generic kernels"
    )


def check_slices(manifest: Manifest, planned: Any, device_class: str | None, fallback: str) -> None:
    """Admission of every rank's 2-D weight slices from the manifest and the plan, before any read.

    What a rank would refuse after its whole load (:func:`~.rank_ops.prepare_ops`): a slice
    :func:`~shardport.kernels.weight.slice_weight` cannot describe (a family no kernel reads, such as
    ``mx_block``; a cut through a group or block), or a quantized slice no kernel admits under the policy
    in either phase (:func:`~shardport.kernels.slice_admission.refusals`). ``device_class``: the ranks'
    (:func:`embedded_device_class`; None, unknown here: the ranks decide). Stacked ``[E, N, K]`` experts
    are left to the ranks. Raises :class:`UnsupportedModelError` (exit 5) with each slice's reasons.
    """
    if device_class is None:
        return
    from shardport.kernels import default_catalog
    from shardport.kernels.device import Device
    from shardport.kernels.errors import KernelError
    from shardport.kernels.expectations import HEAD_SLOTS, dispatched
    from shardport.kernels.policy import FallbackPolicy
    from shardport.kernels.slice_admission import refusals
    from shardport.kernels.weight import slice_weight

    weights = {w.name: w for w in manifest.weights or ()}
    runtime, catalog, policy = manifest.runtime, default_catalog(), FallbackPolicy.from_mode(fallback)
    activations: Any = "bfloat16" if device_class == "cpu/bfloat16" else "float32"
    device = Device(kind="cpu", isa="DEFAULT")  # the ISA the pins use; only int4pack lists ISAs, DEFAULT too
    problems: dict[str, str] = {}  # per weight: its first refused slice's reasons
    for rank in planned.ranks:
        bounds: dict[str, dict[str, Any]] = {}
        for read in rank.reads:
            if read.weight is not None:
                bounds.setdefault(read.weight, {}).update(
                    zip(read.slice.axes, read.slice.bounds, strict=True)
                )
        for name, box in sorted(bounds.items()):
            weight = weights.get(name)
            if weight is None or weight.shape.axes != ("N", "K"):
                continue
            try:
                rw = slice_weight(weight, box)
            except KernelError as exc:
                problems.setdefault(name, str(exc))
                continue
            if not dispatched(weight):  # decoded to float on the rank
                continue
            dtype: Any = "float32" if weight.binding.slot in HEAD_SLOTS else activations
            why = refusals(
                rw,
                catalog,
                activations=dtype,
                device=device,
                policy=policy,
                required=tuple(runtime.kernels_required),
                preferred=tuple(runtime.kernels_preferred),
            )
            if why is not None:
                problems.setdefault(name, why)
    if problems:
        by_why: dict[str, list[str]] = {}  # weights refused alike, listed together
        for name, why in problems.items():
            by_why.setdefault(why, []).append(name)
        shown = "\n".join(
            f"  {names[0]}" + (f" and {len(names) - 1} more alike" if len(names) > 1 else "") + f": {why}"
            for why, names in list(by_why.items())[:8]
        )
        more = f"\n  ... and {len(by_why) - 8} other reasons" if len(by_why) > 8 else ""
        raise UnsupportedModelError(
            f"{len(problems)} weight(s) whose slices no kernel of this shardport would run on {device_class} "
            f"under --fallback {fallback} (admitted from the manifest and plan, before any byte is read):\n"
            f"{shown}{more}"
        )
