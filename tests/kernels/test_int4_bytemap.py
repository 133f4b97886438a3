"""int4pack's byte map learnt from torch's converter: exact read-back, L1 by the map, refusals."""

from __future__ import annotations

from typing import Any

import kernel_cases as kc
import numpy as np
import pytest
import torch

from shardport.kernels import default_catalog, dispatch, ladder, ladder_sampled, rank_weight
from shardport.kernels.device import cpu_isa
from shardport.kernels.errors import ByteMapError, IsaMismatchError
from shardport.kernels.int4_bytemap import _REFUSED, byte_map, refuse
from shardport.kernels.int4_cpu import PreparedInt4, int4_terms, pack_codes
from shardport.kernels.parity import L1Codes, _level1, level1, level1_by_map

DIGEST = "sha256:" + "0" * 64


def _torch_pack(u: np.ndarray) -> np.ndarray:
    codes = torch.from_numpy(np.ascontiguousarray(u, dtype=np.int32))
    packed: np.ndarray = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1).numpy()
    return packed


@pytest.mark.parametrize("k", [64, 96, 512])
@pytest.mark.parametrize("tail", [0, 16, 32, 48])
def test_map_is_a_bijection_and_reads_torch_packing_back(k: int, tail: int) -> None:
    learnt = byte_map(k, tail)
    assert learnt.isa == cpu_isa() and learnt.tail == tail
    for m in [learnt.block] + ([learnt.tail_map] if learnt.tail_map is not None else []):
        assert np.array_equal(np.sort(np.concatenate([m.lo, m.hi])), np.arange(m.rows * k))
    assert (learnt.tail_map is None) == (tail == 0)
    assert learnt.block.plan is not None  # every ISA measured packs a block as a pairing + transpose
    gathered = learnt.gathered()
    rng = np.random.default_rng(k * 100 + tail)
    for blocks in (0, 1, 3):
        n = 64 * blocks + tail
        if n == 0:
            continue
        u = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
        packed = _torch_pack(u)
        assert np.array_equal(learnt.unpack(packed), u), n
        assert np.array_equal(learnt.pack(u), packed), n  # map-pack bytes == torch's converter bytes
        assert np.array_equal(learnt.pack(u.view(np.int8)), packed)  # the fast path's int8 codes
        assert np.array_equal(gathered.unpack(packed), u) and np.array_equal(gathered.pack(u), packed)


@pytest.mark.slow
def test_maps_learnt_under_every_forced_isa_read_torch_packing_back() -> None:
    """ATEN_CPU_CAPABILITY avx2 and default (and the native ISA above): every map is exact."""
    for isa in ("avx2", "default"):
        out = kc.under_isa("bytemap_probe.py", isa)
        capability, verdict = out.split(maxsplit=1)
        assert capability == isa.upper() and verdict.strip() == "maps=ok", out


def test_shapes_the_converter_does_not_take_are_refused() -> None:
    with pytest.raises(ByteMapError, match="multiple of 32"):
        byte_map(48, 0)
    with pytest.raises(ByteMapError, match="N % 64"):
        byte_map(64, 8)
    learnt = byte_map(64, 16)
    with pytest.raises(ByteMapError, match="N % 64 == 16"):
        learnt.unpack(np.zeros((64, 32), dtype=np.uint8))
    with pytest.raises(ByteMapError, match="uint8"):
        learnt.unpack(np.zeros((80, 30), dtype=np.uint8))


def _prepared(case: kc.Case, bounds: dict[str, tuple[int, int]]):
    weight = rank_weight(case.weight, kc.slice_planes(case, bounds), bounds)
    prepared, trace = dispatch(  # preferred: in float32 (its slow path) int4pack comes after gguf-direct
        weight, default_catalog(), activation_dtype="float32", phase="decode", preferred=["cpu.int4pack"]
    )
    assert isinstance(prepared, PreparedInt4), trace.selected
    return weight, prepared


@pytest.fixture(scope="module")
def q4_0() -> kc.Case:
    return kc.gguf("Q4_0", 336, 256)  # N % 64 == 16: whole blocks and a tail


def test_a_flipped_nibble_is_caught_by_the_map_naming_row_and_column(q4_0: kc.Case) -> None:
    weight, prepared = _prepared(q4_0, {"N": (64, 336), "K": (0, 256)})  # rows 64.. of the weight
    clean = level1_by_map(prepared, weight)
    assert clean.passed and clean.readback == "byte-map+kernel" and clean.codes_compared == 272 * 256
    assert clean.map_mismatches == 0
    u = int4_terms(weight, fast=False).u.astype(np.uint8)
    r, c = 203, 77  # in the tail block
    changed = u.copy()
    changed[r, c] ^= 5
    differ = np.flatnonzero(_torch_pack(u) != _torch_pack(changed))  # which byte torch puts it in
    assert differ.size == 1
    flat = prepared.packed.view(-1)
    flat[int(differ[0])] ^= int((_torch_pack(u) ^ _torch_pack(changed)).reshape(-1)[differ[0]])
    bad = level1_by_map(prepared, weight)
    assert not bad.passed and bad.mismatches == 1 and bad.readback == "byte-map+kernel"
    assert bad.first_mismatch == f"row {64 + r} column {c}: {u[r, c]} -> {changed[r, c]}"
    by_kernel = level1(prepared, weight)  # the kernel reads the same flipped code
    assert by_kernel.first_mismatch == bad.first_mismatch and by_kernel.readback == "kernel"


def test_sampled_ladder_reads_codes_by_the_map_and_full_ladder_holds_it_to_the_kernel(q4_0: kc.Case) -> None:
    weight, prepared = _prepared(q4_0, {"N": (0, 336), "K": (0, 256)})
    sampled = ladder_sampled(
        prepared, weight, manifest_digest=DIGEST, verified_tiles=1, represented_by="its representative"
    )
    assert sampled.passed and sampled.l1.readback == "byte-map+kernel"
    assert sampled.l1.codes_compared == 336 * 256 and sampled.l1.map_mismatches == 0
    x = np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)
    full = ladder(prepared, weight, manifest_digest=DIGEST, verified_tiles=1, activations=(x,))
    assert full.passed and full.l1.readback == "kernel+byte-map" and full.l1.map_mismatches == 0
    assert np.array_equal(prepared.map_codes(), prepared.probe_codes())


def test_a_map_that_disagrees_with_the_kernel_fails_l1(q4_0: kc.Case) -> None:
    weight, prepared = _prepared(q4_0, {"N": (0, 336), "K": (0, 256)})
    expected, found = prepared.code_check(weight)
    mapped = np.array(found, dtype=np.uint8)
    mapped[17, 3] ^= 1  # as if the map had misplaced one nibble
    result = _level1(prepared, weight, (expected, found), mapped=mapped)
    assert result.mismatches == 0 and result.map_mismatches == 1 and not result.passed
    assert result.first_mismatch is not None and result.first_mismatch.startswith("row 17 column 3: byte map")


def test_the_map_is_read_only_under_the_isa_that_packed(q4_0: kc.Case) -> None:
    _, prepared = _prepared(q4_0, {"N": (0, 336), "K": (0, 256)})
    prepared.isa = "AVX2" if prepared.isa != "AVX2" else "AVX512"  # as if packed on another machine
    with pytest.raises(IsaMismatchError):
        prepared.map_codes()


def test_old_l1_records_read_as_kernel_read_back() -> None:
    old = {
        "applicable": True,
        "codes_compared": 4,
        "mismatches": 0,
        "first_mismatch": None,
        "representation": "repack",
        "max_reconstruction_error": 0.0,
        "passed": True,
    }
    record = L1Codes.model_validate(old)
    assert record.readback == "kernel" and record.map_mismatches is None


def test_prepared_bytes_are_packed_by_the_map_and_equal_the_converters(q4_0: kc.Case) -> None:
    for bounds in (
        {"N": (0, 336), "K": (0, 256)},
        {"N": (16, 336), "K": (0, 128)},
        {"N": (0, 48), "K": (0, 256)},
    ):
        weight, prepared = _prepared(q4_0, bounds)
        u = int4_terms(weight, fast=False).u
        assert prepared.map_refusal is None, prepared.map_refusal
        assert torch.equal(prepared.packed, pack_codes(u)), bounds  # byte-identical to torch's converter


def test_a_refused_map_packs_by_the_converter_and_reads_back_by_the_kernel() -> None:
    case = kc.gptq(80, 224, 32)  # K 224 and N % 64 == 16: a map no other test learns
    learnt = byte_map(224, 16)
    refuse(learnt, ByteMapError("test", "byte map", "agreement with the converter", "a disagreement"))
    try:
        weight, prepared = _prepared(case, {"N": (0, 80), "K": (0, 224)})
        assert prepared.map_refusal is not None and "disagreement" in prepared.map_refusal
        assert torch.equal(prepared.packed, pack_codes(int4_terms(weight, fast=False).u))
        assert prepared.map_codes() is None
        sampled = ladder_sampled(
            prepared, weight, manifest_digest=DIGEST, verified_tiles=1, represented_by="x"
        )
        assert sampled.l1.passed and sampled.l1.readback == "kernel"
        with pytest.raises(ByteMapError, match="disagreement"):
            byte_map(224, 16)
    finally:
        _REFUSED.pop((learnt.isa, 224, 16))
    assert byte_map(224, 16) is learnt


def test_a_map_wrong_on_a_middle_block_the_same_way_both_ways_fails_the_sampled_l1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The map packed these bytes, so map-unpack(map-pack) agrees with the planes whatever the map; the
    kernel's read-back of the spot columns is what catches a map wrong on a block the converter
    comparison (first and last block) does not see."""
    import shardport.kernels.int4_bytemap as bm

    apply = bm._apply

    def swap(a: np.ndarray) -> None:  # two bytes of the second 64-row block trade places
        b = a.reshape(a.shape[0] // 64, -1)
        b[1, [0, 1]] = b[1, [1, 0]]

    def wrong(step: Any, src: Any, dst: Any, src_rows: Any, dst_rows: Any) -> None:
        if src_rows < dst_rows:  # unpacking: bytes in
            src = src.copy()
            swap(src)
            apply(step, src, dst, src_rows, dst_rows)
        else:  # packing: bytes out
            apply(step, src, dst, src_rows, dst_rows)
            swap(dst)

    bm.byte_map(256, 0)  # learnt (and proved) before the fault: the map goes wrong after its checks
    monkeypatch.setattr(bm, "_apply", wrong)
    weight, prepared = _prepared(kc.gptq(256, 256, 32), {"N": (0, 256), "K": (0, 256)})
    assert prepared.map_refusal is None  # the converter check on the first and last block passed
    sampled = level1_by_map(prepared, weight)
    assert not sampled.passed and sampled.readback == "byte-map+kernel"
    assert sampled.mismatches > 0 and sampled.first_mismatch is not None
    assert sampled.first_mismatch.startswith("row 64 ")  # the second block's first row
    assert not level1(prepared, weight).passed  # the kernel's whole read-back says the same
