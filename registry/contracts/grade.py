"""GRIT grades for numeric contracts, where GRIT version 1 can express them.

A GRIT grade (package ``grit-datatype``) is the decode contract as one canonical string with a
64-bit id. We record it when the contract maps onto GRIT's fields exactly and otherwise say why not —
an honest ``{expressible: false, why}`` is worth more than a near-miss grade.

Mapping: element format from the codes' value encoding (``u2/u4/u6/u8``, ``s4_twos``→``s4``,
``s8``); ``k0`` = group size along K; ``s0`` = scale format; an integer zero plane gives ``zp`` and
``zpc`` (``as_is``→``asis``, ``minus_one``→``minus1``); ``affine_round_to_scale_format`` gives
``dt`` = the scale format. ``esr`` (how the producer derived scales) is required by GRIT but is not
decode-relevant; we record ``affineminmax`` when there is a zero-point plane and ``ratiomaxabs``
otherwise, the producers' usual rules. Placement (e.g. AWQ's slot order) is not part of a grade.
"""

from __future__ import annotations

import grit
from grit.infer import GGML_INFERENCE

from shardport.registry.formats.elements import ELEMENTS

from .model import (
    AffineIntContract,
    FloatContract,
    GgufBlockContract,
    GlobalScalePlane,
    GritRecord,
    GroupMapIndex,
    MicroscaleContract,
    PermutationPlane,
    ZeroFloatPlane,
    ZeroImplicit,
    ZeroIntPlane,
)

_ELEMENT = {"u2": "u2", "u4": "u4", "u6": "u6", "u8": "u8", "s4_twos": "s4", "s8": "s8"}
_SCALE = {"binary32": "binary32", "binary16": "binary16", "e8m0": "e8m0", "e4m3": "e4m3"}
_CARRIER = "an unquantized carrier type; GRIT grades describe block-scaled formats"


def _no(why: str) -> GritRecord:
    return GritRecord(expressible=False, grade=None, grade_id=None, why=why)


def _yes(grade: str) -> GritRecord:
    canonical = grit.canonicalize(grade)
    return GritRecord(
        expressible=True, grade=canonical, grade_id=f"{grit.grade_id_of(canonical):016x}", why=None
    )


def _element(encoding: str, role: str) -> str | GritRecord:
    if encoding in _ELEMENT:
        return _ELEMENT[encoding]
    if "_offset" in encoding:
        return _no(
            f"{role} encoding {encoding} stores an implicit zero point as an offset; GRIT v1 requires "
            "a zero-point plane for any zero point"
        )
    return _no(f"{role} encoding {encoding} has no GRIT v1 element format")


def _affine(contract: AffineIntContract) -> GritRecord:
    element = _element(contract.codes.encoding, "codes")
    if isinstance(element, GritRecord):
        return element
    scales = contract.scales
    if scales.format not in _SCALE:
        return _no(f"scale format {scales.format} has no GRIT v1 spelling (bfloat16 is not binary16)")
    if scales.group_axis != "K" or scales.levels != 1:
        return _no("GRIT v1 groups along the contiguous (K) axis with this shardport's one scale level")
    if isinstance(contract.group_map, GroupMapIndex) and not contract.group_map.sequential:
        return _no("an act-order g_idx group map has no GRIT v1 field")
    if isinstance(contract.permutation, PermutationPlane):
        return _no("a column permutation plane has no GRIT v1 field")
    fields = [f"e={element}", f"k0={scales.group_size}", f"s0={_SCALE[scales.format]}"]
    zero = contract.zero_point
    if isinstance(zero, ZeroImplicit):
        return _no(f"the zero point is an implicit constant {zero.value}; GRIT v1 requires a zp plane")
    if isinstance(zero, ZeroFloatPlane):
        return _no("a float zero-point plane (s*(q - z) with real z) has no GRIT v1 zp format here")
    if isinstance(zero, ZeroIntPlane):
        zp = _element(zero.encoding, "zero-point")
        if isinstance(zp, GritRecord):
            return zp
        fields += [f"zp={zp}", f"zpc={'minus1' if zero.convention == 'minus_one' else 'asis'}"]
        fields.append("esr=affineminmax")
    else:
        fields.append("esr=ratiomaxabs")
    if contract.decode_law == "affine_round_to_scale_format":
        fields.append(f"dt={_SCALE[scales.format]}")
    return _yes("grit1(" + ",".join(fields) + ")")


def _microscale(contract: MicroscaleContract) -> GritRecord:
    """MXFP4 / NVFP4 as GRIT's ``GRADE_MXFP4`` / ``GRADE_NVF4`` where the decode is the same number.

    MXFP4: ``e2m1 · 2^(e-127)`` is exact in binary32 and in bfloat16, so both laws decode as GRIT's
    MXFP4. NVFP4: GRIT multiplies the E4M3 scale by the binary32 per-tensor scale and keeps binary32;
    compressed-tensors divides by its global scale and rounds the product to bfloat16 — other bits.
    """
    if isinstance(contract.permutation, PermutationPlane):
        return _no("a column permutation plane has no GRIT v1 field")
    if contract.scales.physical_axes != ("N", "G"):
        return _no("a transposed (G-major) scale plane is a placement GRIT v1 does not record")
    if contract.scheme == "mxfp4":
        return _yes(grit.GRADE_MXFP4)
    glob = contract.global_scale
    if isinstance(glob, GlobalScalePlane) and glob.law == "divide":
        return _no(
            "the block scale is divided by the global scale (compressed-tensors); GRIT v1 NVF4 multiplies "
            "by its per-tensor binary32 scale, which rounds differently"
        )
    if contract.decode_law == "mx_round_bf16":
        return _no("the product is rounded to bfloat16; GRIT v1 NVF4 decodes to binary32")
    return _yes(grit.GRADE_NVF4)


def grade_contract(
    contract: FloatContract | AffineIntContract | GgufBlockContract | MicroscaleContract,
) -> GritRecord:
    """Return the GRIT record of a contract (its own ``grit`` field is ignored)."""
    if isinstance(contract, MicroscaleContract):
        return _microscale(contract)
    if isinstance(contract, FloatContract):
        return _no(f"{contract.format} is {_CARRIER}")
    if isinstance(contract, GgufBlockContract):
        entry = GGML_INFERENCE.get(contract.ggml_type)
        if entry is None:
            if ELEMENTS[contract.ggml_type].block > 1:
                return _no(f"ggml {contract.ggml_type}: GRIT v1's ggml table has no entry for this type")
            return _no(f"ggml {contract.ggml_type} is {_CARRIER}")
        if entry.grade is None:
            return _no(f"ggml {contract.ggml_type}: {entry.note}")
        return _yes(entry.grade)
    return _affine(contract)
