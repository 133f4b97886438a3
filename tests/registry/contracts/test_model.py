"""The contract models: frozen, strict, and round-trip safe through JSON and RFC 8785 canonical form."""

from __future__ import annotations

import base64
import hashlib
import json

import numpy as np
import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from shardport.registry.contracts import LogicalWeight
from shardport.registry.contracts.encodings import encoding_bits
from shardport.registry.contracts.model import CodesSpec, DecodeWitness, Packing

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz._0123456789", min_size=1, max_size=24)
extents = st.integers(min_value=1, max_value=4096)
label = st.builds(
    dict,
    kind=st.sampled_from(["declared", "inferred"]),
    evidence=st.lists(st.text(max_size=40), min_size=1, max_size=3),
)
grit = st.one_of(
    st.builds(
        dict,
        expressible=st.just(True),
        grade=st.text(min_size=1, max_size=30),
        grade_id=st.text(alphabet="0123456789abcdef", min_size=16, max_size=16),
        why=st.none(),
    ),
    st.builds(dict, expressible=st.just(False), grade=st.none(), grade_id=st.none(), why=st.text(min_size=1)),
)


@st.composite
def packing(draw, bits: int, axes: tuple[str, ...]) -> dict:
    axis = draw(st.sampled_from([*axes, "none"]))
    if axis == "none":
        return {
            "axis": "none",
            "container_bits": 32,
            "scheme": "slots",
            "slot_order": [0],
            "bit_order": "lsb_first",
            "tail": "exact",
        }
    if draw(st.booleans()):
        return {
            "axis": axis,
            "container_bits": 32,
            "scheme": "bitstream",
            "slot_order": [],
            "bit_order": "lsb_first",
            "tail": draw(st.sampled_from(["exact", "zero_fill"])),
        }
    order = draw(st.permutations(list(range(32 // bits))))
    return {
        "axis": axis,
        "container_bits": 32,
        "scheme": "slots",
        "slot_order": order,
        "bit_order": draw(st.sampled_from(["lsb_first", "msb_first"])),
        "tail": draw(st.sampled_from(["exact", "zero_fill"])),
    }


@st.composite
def affine(draw, tensors: list[str]) -> dict:
    codes_name, scales_name, zero_name, g_name, perm_name = tensors
    bits = draw(st.sampled_from([2, 4, 8]))
    encoding = draw(
        st.sampled_from(
            [f"u{bits}", f"s{bits}_offset{1 << (bits - 1)}", "s8" if bits == 8 else f"s{bits}_twos"]
        )
    )
    code_axes = draw(st.permutations(["N", "K"]))
    zero = draw(st.sampled_from(["none", "implicit", "int_plane", "float_plane"]))
    zero_point: dict = {"kind": zero}
    if zero == "implicit":
        zero_point["value"] = draw(st.integers(-128, 255))
    elif zero == "int_plane":
        zero_axes = draw(st.permutations(["G", "N"]))
        zero_point |= {
            "plane": zero_name,
            "physical_dtype": "I32",
            "physical_shape": [draw(extents), draw(extents)],
            "physical_axes": zero_axes,
            "bits": bits,
            "encoding": encoding,
            "packing": draw(packing(bits, ("N",))),
            "convention": draw(st.sampled_from(["as_is", "minus_one"])),
        }
    elif zero == "float_plane":
        zero_point |= {
            "plane": zero_name,
            "physical_dtype": "F16",
            "physical_shape": [draw(extents), 1],
            "physical_axes": ["N", "G"],
            "format": "binary16",
            "law": "code_minus_zero",
        }
    group_map = draw(
        st.sampled_from(
            [
                {"kind": "none"},
                {
                    "kind": "g_idx",
                    "plane": g_name,
                    "physical_dtype": "I32",
                    "physical_shape": [64],
                    "sequential": False,
                },
            ]
        )
    )
    return {
        "family": "affine_int",
        "codes": {
            "plane": codes_name,
            "physical_dtype": "I32",
            "physical_shape": [draw(extents), draw(extents)],
            "physical_axes": code_axes,
            "bits": bits,
            "encoding": encoding,
            "packing": draw(packing(bits, tuple(code_axes))),
        },
        "scales": {
            "plane": scales_name,
            "physical_dtype": "F16",
            "physical_shape": [draw(extents), draw(extents)],
            "physical_axes": draw(st.permutations(["G", "N"])),
            "format": draw(st.sampled_from(["binary16", "bfloat16", "binary32", "e8m0", "e4m3"])),
            "storage": draw(st.sampled_from(["numeric", "raw_bits"])),
            "sign": draw(st.sampled_from(["positive", "signed"])),
            "group_axis": "K",
            "group_size": draw(extents),
            "group_count": draw(extents),
            "tail_rule": draw(st.sampled_from(["exact", "partial_last"])),
            "placement": "row_major",
            "levels": 1,
        },
        "zero_point": zero_point,
        "group_map": group_map,
        "permutation": draw(
            st.sampled_from(
                [
                    {"kind": "none"},
                    {
                        "kind": "plane",
                        "plane": perm_name,
                        "physical_dtype": "I32",
                        "physical_shape": [64],
                        "axis": "K",
                        "direction": "logical_to_stored",
                    },
                ]
            )
        ),
        "decode_law": draw(st.sampled_from(["affine_f32", "affine_round_to_scale_format"])),
        "label": draw(label),
        "grit": draw(grit),
    }


@st.composite
def witness(draw) -> dict:
    rows = draw(st.lists(st.integers(0, 10_000), min_size=1, max_size=4))
    columns = draw(st.integers(1, 8))
    values = np.array(
        draw(
            st.lists(
                st.floats(width=32, allow_nan=False),
                min_size=len(rows) * columns,
                max_size=len(rows) * columns,
            )
        ),
        dtype="<f4",
    )
    raw = values.tobytes()
    return {
        "seed": draw(st.integers(0, 2**53 - 1)),
        "rows": rows,
        "columns": columns,
        "values_f32le": base64.b64encode(raw).decode(),
        "values_sha256": hashlib.sha256(raw).hexdigest(),
        "rel_error": draw(st.one_of(st.none(), st.floats(0, 10, allow_nan=False))),
    }


@st.composite
def logical_weight(draw) -> dict:
    tensors = draw(st.lists(names, min_size=5, max_size=5, unique=True))
    family = draw(st.sampled_from(["float", "affine_int", "gguf_block"]))
    if family == "affine_int":
        contract = draw(affine(tensors))
    elif family == "float":
        contract = {
            "family": "float",
            "plane": tensors[0],
            "physical_dtype": "BF16",
            "format": "bfloat16",
            "decode_law": "float_upcast",
            "label": draw(label),
            "grit": draw(grit),
        }
    else:
        contract = {
            "family": "gguf_block",
            "ggml_type": draw(st.sampled_from(["Q4_K", "Q6_K", "Q8_0", "F16"])),
            "plane": tensors[0],
            "decode_law": "ggml_block",
            "label": draw(label),
            "grit": draw(grit),
        }
    roles = {
        "codes": "codes",
        "scales": "scale",
        "zero_point": "zero",
        "group_map": "g_idx",
        "permutation": "perm",
    }
    planes = {
        part["plane"]: role for key, role in roles.items() if "plane" in (part := contract.get(key) or {})
    }
    if "plane" in contract:
        planes[contract["plane"]] = "float" if family == "float" else "codes"
    return {
        "name": draw(names),
        "shape": {"axes": ["N", "K"], "extents": [draw(extents), draw(extents)]},
        "planes": [
            {"role": role, "tensor": tensor, "dtype": "I32", "shape": [1, 2]}
            for tensor, role in planes.items()
        ],
        "contract": contract,
        "binding": {
            "architecture": draw(st.one_of(st.none(), names)),
            "layer": draw(st.one_of(st.none(), extents)),
            "slot": draw(names),
            "expert": draw(st.one_of(st.none(), extents)),
            "tied_alias": draw(st.one_of(st.none(), names)),
        },
        "witness": draw(st.one_of(st.none(), witness())),
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logical_weight())
def test_logical_weight_round_trip(data):
    weight = LogicalWeight.model_validate(data)
    assert LogicalWeight.model_validate_json(weight.model_dump_json()) == weight
    canonical = rfc8785.dumps(weight.model_dump(mode="json"))
    again = LogicalWeight.model_validate(json.loads(canonical))
    assert again == weight and rfc8785.dumps(again.model_dump(mode="json")) == canonical


def test_models_are_frozen_and_strict():
    packing_ok = Packing(
        axis="K",
        container_bits=32,
        scheme="slots",
        slot_order=tuple(range(8)),
        bit_order="lsb_first",
        tail="exact",
    )
    with pytest.raises(ValidationError):
        packing_ok.axis = "N"
    with pytest.raises(ValidationError, match="extra"):
        Packing.model_validate({**packing_ok.model_dump(), "surprise": 1})
    with pytest.raises(ValidationError, match="permutation"):
        CodesSpec(
            plane="q",
            physical_dtype="I32",
            physical_shape=(8, 8),
            physical_axes=("K", "N"),
            bits=4,
            encoding="u4",
            packing=packing_ok.model_copy(update={"slot_order": (0, 0, 1, 2, 3, 4, 5, 6)}),
        )
    with pytest.raises(ValidationError, match="not 4-bit"):
        CodesSpec(
            plane="q",
            physical_dtype="I32",
            physical_shape=(8, 8),
            physical_axes=("K", "N"),
            bits=4,
            encoding="u8",
            packing=packing_ok,
        )
    with pytest.raises(ValueError, match="offset"):
        encoding_bits("s4_offset7")
    raw = np.zeros(4, dtype="<f4").tobytes()
    with pytest.raises(ValidationError, match="sha256"):
        DecodeWitness(
            seed=0,
            rows=(1,),
            columns=4,
            values_f32le=base64.b64encode(raw).decode(),
            values_sha256="0" * 64,
            rel_error=None,
        )
    good = {
        "rows": (1,),
        "columns": 1,
        "values_f32le": base64.b64encode(raw[:4]).decode(),
        "values_sha256": hashlib.sha256(raw[:4]).hexdigest(),
        "rel_error": None,
    }
    DecodeWitness(seed=2**53 - 1, **good)
    with pytest.raises(ValidationError):
        DecodeWitness(seed=2**53, **good)  # not exact in RFC 8785 JSON
    with pytest.raises(ValidationError):
        DecodeWitness(seed=0, **{**good, "rel_error": float("nan")})
