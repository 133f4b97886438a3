"""The evidence rows of parity L1-L3 and L4's tolerance over real ladder records (no bring-up).

Ladders of a small GGUF Q8_0 weight under real kernels, dumped as a rank reports them: L1 says "not
applicable" (passed None, with the reason) only where no ladder compared a code; L2 and L3 name their
tolerance sources; L4's tolerance does not grow with a conversion's measured error.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from shardport.deploy.rank_ops import policy_of
from shardport.deploy.up_evidence import _ladder_rows, tolerance
from shardport.kernels import Catalog, FallbackPolicy, RankWeight, dispatch, ladder, rank_weight
from shardport.kernels.gguf_kernel import GgufDirectKernel
from shardport.kernels.reference import FullDequantKernel, ReferenceKernel
from shardport.registry.contracts import TensorInfo, infer_gguf

N, K = 64, 256
TENSOR = "blk.0.ffn_down.weight"
DIGEST = "sha256:" + "3" * 64


@pytest.fixture(scope="module")
def q8_0() -> RankWeight:
    w = (np.random.default_rng(4).standard_normal((N, K)) * 0.1).astype(np.float32)
    data = quants.quantize(w, GGMLQuantizationType.Q8_0)
    weights = infer_gguf({"general.architecture": "llama"}, [TensorInfo(TENSOR, "Q8_0", (N, K))])
    return rank_weight(next(x for x in weights if x.name == TENSOR), {TENSOR: data})


def _record(weight: RankWeight, kernel: Any, dtype: str = "float32") -> dict[str, Any]:
    prepared, _ = dispatch(
        weight,
        Catalog([kernel]),
        activation_dtype=dtype,
        phase="decode",
        policy=FallbackPolicy.from_cli("allow"),
    )
    xs = (np.random.default_rng(5).standard_normal((2, K)).astype(np.float32),)
    result = ladder(prepared, weight, manifest_digest=DIGEST, verified_tiles=1, activations=xs)
    return result.model_dump(mode="json")


def _rows(*ladders: dict[str, Any]) -> dict[str, dict[str, Any]]:
    report = {"rank": 0, "ladders": list(ladders), "ladder_mode": "full", "dispatch": []}
    return {row["level"]: row for row in _ladder_rows([report], DIGEST)}


def test_l1_is_not_applicable_only_where_no_code_was_compared(q8_0: RankWeight) -> None:
    reference = _record(q8_0, ReferenceKernel())
    rows = _rows(reference)
    l1 = rows["L1"]
    assert l1["status"] == "not applicable" and l1["passed"] is None and l1["value"] is None
    assert "reference decoder itself" in l1["detail"] and "no code compared on 1 operators" in l1["detail"]
    assert rows["L2"]["passed"] and rows["L3"]["passed"]  # the other levels still measure

    direct = _record(q8_0, GgufDirectKernel())
    rows = _rows(direct, reference)
    l1 = rows["L1"]
    assert "status" not in l1 and l1["passed"] is True and l1["value"] == 0
    compared = direct["l1"]["codes_compared"]
    assert compared > 0 and f"{compared} codes compared exactly on 1 of 2 operators" in l1["detail"]
    assert "kernel-values 1" in l1["detail"] and "not applicable on 1" in l1["detail"]

    direct["l1"]["mismatches"], direct["l1"]["passed"] = 1, False  # a mismatch fails the row
    assert _rows(direct, reference)["L1"]["passed"] is False


def test_l2_and_l3_name_their_tolerance_sources(q8_0: RankWeight) -> None:
    exact = _record(q8_0, GgufDirectKernel())
    dense = _record(q8_0, FullDequantKernel(), "bfloat16")
    rows = _rows(exact, dense)
    assert "exact: the layout keeps or permutes" in rows["L2"]["tolerance_source"]
    assert "rounding to a dense bfloat16 copy" in rows["L2"]["tolerance_source"]
    assert "KERNEL_TOLERANCE[full-dequant][bfloat16] + ‖|X|·B^T‖" in rows["L3"]["tolerance_source"]
    assert rows["L2"]["passed"] and 0 < rows["L2"]["value"] <= rows["L2"]["tolerance"]
    batch = dense["l3"][0]
    assert batch["tol_conversion"] > 0 and "‖|X|·B^T‖/‖Y_ref‖" in batch["tolerance_source"]
    assert rows["L3"]["tolerance"] == pytest.approx(
        max(x["tol_kernel"] + x["tol_conversion"] for lad in (exact, dense) for x in lad["l3"])
    )


def test_the_l4_tolerance_does_not_grow_with_a_measured_conversion_error(q8_0: RankWeight) -> None:
    record = _record(q8_0, GgufDirectKernel())
    report = {"rank": 0, "ladders": [record], "dispatch": [{"requested": {"activation_dtype": "float32"}}]}
    base = tolerance([report], 2, 5.0)
    record["l3"][0]["e_conversion"] = 0.5  # the old rule took max(e_kernel, e_conversion)
    assert tolerance([report], 2, 5.0)["value"] == base["value"]
    record["l3"][0]["e_kernel"] = 0.3  # over its L3 tolerance: fails L3, widens L4 no further than that
    capped = tolerance([report], 2, 5.0)
    assert capped["e_kernel_max"] == pytest.approx(record["l3"][0]["tol_kernel"])
    record["l3"][0]["e_kernel"] = float("nan")  # a NaN stays NaN (L4 then fails, sealed)
    assert np.isnan(tolerance([report], 2, 5.0)["value"])


def test_fallback_forbid_forbids_conversions_too() -> None:
    assert policy_of("forbid") == FallbackPolicy(conversion="forbid", generic="forbid", full_dequant="forbid")
    assert policy_of("warn") == FallbackPolicy()  # conversions allowed: held to their budget by L2/L3
    assert policy_of("allow").conversion == "allow"
