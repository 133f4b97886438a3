"""The direct GGUF block kernel against gguf.quants.dequantize + a float64 matmul.

Block bytes come from ``gguf.quants.quantize`` where it supports the type, else from random bytes
whose blocks all decode to finite values (a block that does not is redrawn, then zeroed).

Tolerance: the kernel accumulates in float32, so against the float64 product of the same decoded
weight it may differ by float32 summation error: ``|y - y64| <= K * 2**-23 * (|x| @ |W|.T)``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize

from shardport.kernels import gguf_errors as ge
from shardport.kernels.gguf_direct import (
    GGUF_DIRECT_TYPES,
    NATIVE_TYPES,
    gguf_block_decode,
    gguf_block_matmul,
    k_slice_bytes,
    row_bytes_for,
    workspace_bytes,
)
from shardport.registry.errors import RefusedError

QUANTIZABLE = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0", "TQ2_0", "MXFP4", "BF16", "F16", "F32"}
ALL_TYPES = sorted(GGUF_DIRECT_TYPES)


def _geometry(name: str) -> tuple[int, int]:
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    return int(block), int(type_size)


def _k_unit(name: str) -> int:
    """A K that is a whole number of blocks and of 256 (so every type shares test shapes)."""
    return max(256, _geometry(name)[0])


def make_blocks(name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """uint8 [n, row_bytes] of ``name`` whose every block decodes to finite values."""
    qtype = GGMLQuantizationType[name]
    rng = np.random.default_rng(seed)
    if name in QUANTIZABLE:
        weights = rng.standard_normal((n, k)).astype(np.float32)
        raw = np.asarray(quantize(weights, qtype))
        return np.ascontiguousarray(raw.view(np.uint8).reshape(n, -1))
    block, type_size = _geometry(name)
    flat = rng.integers(0, 256, (n * k // block, type_size), dtype=np.uint8)
    for _ in range(4):
        with np.errstate(all="ignore"):
            bad = ~np.isfinite(dequantize(flat, qtype)).all(axis=1)
        if not bad.any():
            break
        flat[bad] = rng.integers(0, 256, (int(bad.sum()), type_size), dtype=np.uint8)
    with np.errstate(all="ignore"):
        flat[~np.isfinite(dequantize(flat, qtype)).all(axis=1)] = 0
    return flat.reshape(n, k // block * type_size)


def reference(x: torch.Tensor, blocks: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(float64 x @ W.T, the float32 summation bound) with W from gguf.quants.dequantize."""
    weight = dequantize(blocks, GGMLQuantizationType[name]).astype(np.float64)
    x64 = x.to(torch.float64).numpy()
    bound = np.abs(x64) @ np.abs(weight).T * (x64.shape[1] * 2.0**-23) + 1e-30
    return x64 @ weight.T, bound


def assert_close(y: torch.Tensor, ref: np.ndarray, bound: np.ndarray) -> None:
    assert y.dtype == torch.float32
    assert tuple(y.shape) == ref.shape
    err = np.abs(y.numpy().astype(np.float64) - ref)
    assert np.all(np.isfinite(y.numpy()))
    assert np.all(err <= bound), f"max err/bound {np.max(err / bound):.3g}"


def test_types_are_native_plus_every_gguf_dequantizer() -> None:
    decodable = set()
    for qtype, (_block, type_size) in GGML_QUANT_SIZES.items():
        try:
            dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
        except NotImplementedError:
            continue
        decodable.add(qtype.name)
    assert decodable == GGUF_DIRECT_TYPES
    assert {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"} <= NATIVE_TYPES


@pytest.mark.parametrize("name", ALL_TYPES)
def test_decode_is_bit_exact_vs_gguf(name: str) -> None:
    """Random bytes (non-finite included) decode to exactly gguf.quants' values, NaN where it has NaN."""
    block, type_size = _geometry(name)
    k = _k_unit(name)
    raw = np.random.default_rng(7).integers(0, 256, (9, k // block * type_size), dtype=np.uint8)
    with np.errstate(all="ignore"):
        ref = dequantize(raw, GGMLQuantizationType[name])
        got = gguf_block_decode(raw, name, k).numpy()
    finite = np.isfinite(ref)
    assert np.array_equal(finite, np.isfinite(got))
    assert np.array_equal(ref[finite].view(np.uint32), got[finite].view(np.uint32))


@pytest.mark.parametrize("name", ALL_TYPES)
@pytest.mark.parametrize("tokens", [1, 64])
def test_matmul_matches_dequant_reference(name: str, tokens: int) -> None:
    """N = 70 with tile_rows 32: two full tiles and a short one."""
    k = 2 * _k_unit(name)
    blocks = make_blocks(name, 70, k, seed=tokens)
    x = torch.randn(tokens, k, generator=torch.Generator().manual_seed(tokens))
    y = gguf_block_matmul(x, blocks, name, k, tile_rows=32)
    assert_close(y, *reference(x, blocks, name))


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "IQ4_XS"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_k_slices_of_whole_blocks(name: str, ranks: int) -> None:
    """Row-parallel (K-split) ranks: each slice is whole blocks; the partial products sum to the whole."""
    unit = _k_unit(name)
    k = ranks * unit
    blocks = make_blocks(name, 45, k, seed=ranks)
    x = torch.randn(5, k, dtype=torch.float64).to(torch.float32)
    total = torch.zeros(5, 45)
    for rank in range(ranks):
        local = np.ascontiguousarray(blocks[:, k_slice_bytes(name, rank * unit, unit)])
        x_local = x[:, rank * unit : (rank + 1) * unit]
        y = gguf_block_matmul(x_local, local, name, unit, tile_rows=16)
        assert_close(y, *reference(x_local, local, name))
        total += y
    full, bound = reference(x, blocks, name)
    assert np.all(np.abs(total.numpy() - full) <= 2 * bound)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_activations_are_widened(dtype: torch.dtype) -> None:
    blocks = make_blocks("Q4_K", 10, 256)
    x = torch.randn(3, 256).to(dtype)
    y = gguf_block_matmul(x, blocks, "Q4_K", 256)
    assert_close(y, *reference(x.to(torch.float32), blocks, "Q4_K"))


def test_memmapped_plane_and_grad_activation(tmp_path) -> None:  # type: ignore[no-untyped-def]
    blocks = make_blocks("Q6_K", 12, 256)
    path = tmp_path / "plane.bin"
    blocks.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r", shape=blocks.shape)
    x = torch.randn(3, 256, requires_grad=True)
    y = gguf_block_matmul(x, mapped, "Q6_K", 256, tile_rows=5)
    assert not y.requires_grad
    assert_close(y, *reference(x.detach(), blocks, "Q6_K"))


def test_read_only_plane_and_empty_operands() -> None:
    blocks = make_blocks("Q8_0", 8, 64)
    frozen = np.frombuffer(blocks.tobytes(), dtype=np.uint8).reshape(blocks.shape)
    assert not frozen.flags.writeable
    x = torch.randn(2, 64)
    assert torch.equal(gguf_block_matmul(x, frozen, "Q8_0", 64), gguf_block_matmul(x, blocks, "Q8_0", 64))
    assert gguf_block_matmul(x, blocks[:0], "Q8_0", 64).shape == (2, 0)
    assert gguf_block_matmul(x[:0], blocks, "Q8_0", 64).shape == (0, 8)


def test_numpy_integer_k_and_tile_rows_are_accepted() -> None:
    blocks = make_blocks("Q4_0", 6, 64)
    x = torch.randn(2, 64)
    y = gguf_block_matmul(x, blocks, "Q4_0", np.int64(64), tile_rows=np.int32(4))  # type: ignore[arg-type]
    assert torch.equal(y, gguf_block_matmul(x, blocks, "Q4_0", 64, tile_rows=4))


def test_workspace_is_one_tile_independent_of_n() -> None:
    assert workspace_bytes("Q4_K", 4096, 256) == int(256 * 4096 * 4 * 1.6)
    assert workspace_bytes("IQ2_XS", 512, 8) > 8 * 512 * 4
    assert row_bytes_for("Q6_K", 512) == 420
    assert row_bytes_for("F16", 6) == 12


def test_k_slice_bytes_refuses_cuts_inside_a_block() -> None:
    assert k_slice_bytes("Q6_K", 512, 256) == slice(420, 630)
    assert k_slice_bytes("Q4_0", 32, 64) == slice(18, 54)
    for start, local in [(16, 32), (-32, 32), (32, 48), (32, 0)]:
        with pytest.raises(ge.BlockAlignmentError) as caught:
            k_slice_bytes("Q4_0", start, local)
        assert caught.value.field in {"K slice start", "K"}
    with pytest.raises(ge.WorkspaceError):
        workspace_bytes("Q4_0", 64, 0)
    with pytest.raises(ge.UnknownGgmlTypeError):
        workspace_bytes("Q8_K", 256, 8)


def _q40(n: int = 4, k: int = 64) -> np.ndarray:
    return make_blocks("Q4_0", n, k)


@pytest.mark.parametrize(
    ("call", "error", "field"),
    [
        (lambda x: gguf_block_matmul(x, _q40(), "Q9_9", 64), ge.UnknownGgmlTypeError, "ggml_type"),
        (lambda x: gguf_block_matmul(x, _q40(), "q4_0", 64), ge.UnknownGgmlTypeError, "ggml_type"),
        (lambda x: gguf_block_matmul(x, _q40(), "Q8_1", 64), ge.UnknownGgmlTypeError, "ggml_type"),
        (lambda x: gguf_block_matmul(x, _q40(), "I8", 64), ge.UnknownGgmlTypeError, "ggml_type"),
        (lambda x: gguf_block_matmul(x, _q40(), ["Q4_0"], 64), ge.UnknownGgmlTypeError, "ggml_type"),
        (lambda x: gguf_block_matmul(x[:, :48], _q40(), "Q4_0", 48), ge.BlockAlignmentError, "K"),
        (lambda x: gguf_block_matmul(x, _q40(), "Q4_0", 0), ge.BlockAlignmentError, "K"),
        (lambda x: gguf_block_matmul(x, _q40(), "Q4_0", True), ge.BlockAlignmentError, "K"),
        (lambda x: gguf_block_matmul(x, _q40(k=96), "Q4_0", 64), ge.RowBytesError, "blocks shape"),
        (lambda x: gguf_block_matmul(x, _q40()[:, :35], "Q4_0", 64), ge.RowBytesError, "blocks shape"),
        (lambda x: gguf_block_matmul(x, _q40().reshape(-1), "Q4_0", 64), ge.RowBytesError, "blocks shape"),
        (lambda x: gguf_block_matmul(x, _q40(), "Q8_0", 64), ge.RowBytesError, "blocks shape"),
        (lambda x: gguf_block_matmul(x, _q40().view(np.int8), "Q4_0", 64), ge.BlockDtypeError, "blocks"),
        (lambda x: gguf_block_matmul(x, torch.from_numpy(_q40()), "Q4_0", 64), ge.BlockDtypeError, "blocks"),
        (
            lambda x: gguf_block_matmul(x, np.asfortranarray(_q40()), "Q4_0", 64),
            ge.NonContiguousBlocksError,
            "blocks layout",
        ),
        (
            lambda x: gguf_block_matmul(x[:, :32], _q40(k=64)[:, :18], "Q4_0", 32),
            ge.NonContiguousBlocksError,
            "blocks layout",
        ),
        (lambda x: gguf_block_matmul(x[:, :32], _q40(), "Q4_0", 64), ge.ActivationError, "x columns"),
        (lambda x: gguf_block_matmul(x[None], _q40(), "Q4_0", 64), ge.ActivationError, "x"),
        (lambda x: gguf_block_matmul(x.double(), _q40(), "Q4_0", 64), ge.ActivationError, "x"),
        (lambda x: gguf_block_matmul(x.numpy(), _q40(), "Q4_0", 64), ge.ActivationError, "x"),
        (lambda x: gguf_block_matmul(x, _q40(), "Q4_0", 64, tile_rows=0), ge.WorkspaceError, "tile_rows"),
    ],
)
def test_hostile_inputs_are_refused(call, error: type[ge.KernelInputError], field: str) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(2, 64)
    with pytest.raises(error) as caught:
        call(x)
    assert isinstance(caught.value, RefusedError) and caught.value.exit_code == 5
    assert caught.value.field == field
    assert caught.value.tensor == "gguf weight"
    assert "expected" in str(caught.value) and " — " in str(caught.value)


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(field)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q3_K", "IQ4_XS"])
def test_peak_memory_is_the_workspace_not_a_float_copy(name: str) -> None:
    """Resident high-water mark of one call (reset just before it) against the declared workspace.

    N = 4096, K = 512: a float32 copy of W would be 8 MiB; the kernel may use its workspace
    (tile_rows 128) plus the result, and 1 MiB of allocator slack: under half the float copy.
    """
    n, k = 4096, 512
    blocks = np.tile(make_blocks(name, 64, k), (n // 64, 1))
    x = torch.randn(4, k)
    gguf_block_matmul(x, blocks[:8], name, k, tile_rows=128)  # warm the code paths
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    before = _status_bytes("VmRSS")
    y = gguf_block_matmul(x, blocks, name, k, tile_rows=128)
    peak = _status_bytes("VmHWM") - before
    allowed = workspace_bytes(name, k, 128) + 2 * y.numel() * 4 + (1 << 20)
    assert peak <= allowed < n * k * 4 // 2, (peak, allowed)
