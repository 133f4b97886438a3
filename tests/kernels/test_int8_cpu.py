"""The CPU int8 weight-only kernel (_weight_int8pack_mm): its torch contract, pinned, and our wrapper.

Tolerances: float32 activations accumulate in float32, so ``|y - y64| <= K * 2**-23 * (|x| @ |W|.T)``
against the float64 product; bfloat16 activations are bit-equal to the emulation "float32 sum of
x*q, times the bfloat16 scale, rounded to bfloat16"; float16 within float16 output rounding (2**-10
relative of ``|x| @ |W|.T``) plus the scale narrowing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardport.kernels.gguf_errors import ActivationError, Int8ContractError
from shardport.kernels.int8_cpu import Int8Fit, int8_fits, int8_weight_only_matmul
from shardport.registry.errors import RefusedError

OP = torch.ops.aten._weight_int8pack_mm


def _operands(t: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=gen)
    codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    scales = torch.rand(n, generator=gen) * 0.02 + 1e-3
    return x, codes, scales


def _reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    weight = codes.double() * scales.double()[:, None]
    x64 = x.double()
    bound = (x64.abs() @ weight.abs().T).numpy()
    return (x64 @ weight.T).numpy(), bound


# --- the op's contract on this torch (pins what the module docstring says) ---------------------


def test_op_contract_scale_dtype_must_match_activation() -> None:
    x, codes, scales = _operands(2, 8, 32)
    with pytest.raises(RuntimeError, match="expected scalar type"):
        OP(x.bfloat16(), codes, scales)
    assert OP(x.bfloat16(), codes, scales.bfloat16()).dtype == torch.bfloat16


def test_op_contract_strided_scales_are_read_wrong_silently() -> None:
    """The hazard the wrapper guards against: no error, wrong numbers."""
    x, codes, scales = _operands(2, 8, 32)
    strided = torch.stack([scales, torch.zeros_like(scales)], dim=1)[:, 0]
    assert not strided.is_contiguous()
    assert not torch.allclose(OP(x, codes, strided), OP(x, codes, scales.contiguous()))
    assert torch.allclose(int8_weight_only_matmul(x, codes, strided), OP(x, codes, scales))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda x, c, s: (x, c.view(torch.uint8), s), "int8"),
        (lambda x, c, s: (x, c.t().contiguous().t(), s), "contiguous"),
        (lambda x, c, s: (x.double(), c, s.double()), "float tensor"),
        (lambda x, c, s: (x[None], c, s), "2D"),
        (lambda x, c, s: (x, c, s[:-1]), "1d tensor with size"),
    ],
)
def test_op_contract_refusals(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RuntimeError, match=message):
        OP(*mutate(*_operands(2, 8, 32)))


@pytest.mark.parametrize(("n", "k"), [(1, 1), (7, 5), (33, 17)])
def test_op_contract_no_n_or_k_multiple(n: int, k: int) -> None:
    x, codes, scales = _operands(3, n, k)
    assert_close_f32(OP(x, codes, scales), *_reference(x, codes, scales), k)


# --- the wrapper -----------------------------------------------------------------------------


def assert_close_f32(y: torch.Tensor, ref: np.ndarray, bound: np.ndarray, k: int) -> None:
    """float32 accumulation error bound against the float64 product: K * 2**-23 * (|x| @ |W|.T)."""
    assert y.dtype == torch.float32 and tuple(y.shape) == ref.shape
    assert np.all(np.abs(y.double().numpy() - ref) <= k * 2.0**-23 * bound + 1e-30)


@pytest.mark.parametrize("tokens", [1, 64])
@pytest.mark.parametrize(("n", "k"), [(70, 96), (5, 33)])
def test_float32_matches_float64_reference(tokens: int, n: int, k: int) -> None:
    x, codes, scales = _operands(tokens, n, k, seed=tokens)
    y = int8_weight_only_matmul(x, codes, scales)
    assert tuple(y.shape) == (tokens, n)
    assert_close_f32(y, *_reference(x, codes, scales), k)


@pytest.mark.parametrize("tokens", [1, 64])
def test_bfloat16_is_bit_equal_to_its_emulation(tokens: int) -> None:
    x, codes, scales = _operands(tokens, 40, 128, seed=3)
    xb = x.bfloat16()
    y = int8_weight_only_matmul(xb, codes, scales)
    emulated = ((xb.float() @ codes.float().T) * scales.bfloat16().float()).bfloat16()
    assert y.dtype == torch.bfloat16 and torch.equal(y, emulated)


def test_float16_within_output_rounding() -> None:
    x, codes, scales = _operands(8, 24, 64, seed=4)
    y = int8_weight_only_matmul(x.half(), codes, scales)
    ref, bound = _reference(x.half().float(), codes, scales)
    assert y.dtype == torch.float16
    assert np.all(np.abs(y.double().numpy() - ref) <= (2.0**-10 + 2.0**-11) * bound * 2)


def test_numpy_operands_and_row_strided_activation() -> None:
    x, codes, scales = _operands(4, 16, 64)
    wide = torch.cat([x, torch.ones(4, 8)], dim=1)[:, :64]
    assert not wide.is_contiguous()
    frozen = np.frombuffer(codes.numpy().tobytes(), dtype=np.int8).reshape(16, 64)
    y = int8_weight_only_matmul(wide, frozen, scales.numpy()[:, None])
    assert torch.equal(y, OP(x, codes, scales))


@pytest.mark.parametrize(
    ("args", "error", "field"),
    [
        (lambda x, c, s: (x, c.view(torch.uint8), s), Int8ContractError, "codes"),
        (lambda x, c, s: (x, c.int(), s), Int8ContractError, "codes"),
        (lambda x, c, s: (x, c[None], s), Int8ContractError, "codes"),
        (lambda x, c, s: (x, c.t().contiguous().t(), s), Int8ContractError, "codes layout"),
        (lambda x, c, s: (x, c.tolist(), s), Int8ContractError, "codes"),
        # GGUF Q8_0 style: one scale per 32 elements of K does not fit per-channel.
        (lambda x, c, s: (x, c, s[:, None].expand(16, 2).contiguous()), Int8ContractError, "scales shape"),
        (lambda x, c, s: (x, c, s[:-1]), Int8ContractError, "scales shape"),
        (lambda x, c, s: (x, c, s.double()), Int8ContractError, "scales dtype"),
        (lambda x, c, s: (x.double(), c, s), ActivationError, "x"),
        (lambda x, c, s: (x[None], c, s), ActivationError, "x"),
        (lambda x, c, s: (x[:, :32], c, s), ActivationError, "x columns"),
    ],
)
def test_hostile_inputs_are_refused(args, error: type[RefusedError], field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error) as caught:
        int8_weight_only_matmul(*args(*_operands(2, 16, 64)))
    assert caught.value.exit_code == 5 and caught.value.field == field  # type: ignore[attr-defined]
    assert caught.value.tensor == "int8 weight"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"n": 4096, "k": 4096}, Int8Fit(True, conversion=True, max_scale_rel_error=2.0**-8)),
        ({"n": 7, "k": 5, "act_dtype": torch.float32}, Int8Fit(True)),
        ({"n": 7, "k": 5, "act_dtype": torch.float16, "scale_dtype": torch.float16}, Int8Fit(True)),
        (
            {"n": 7, "k": 5, "act_dtype": torch.float16},
            Int8Fit(True, conversion=True, max_scale_rel_error=2.0**-11),
        ),
    ],
)
def test_fits(kwargs: dict[str, object], expected: Int8Fit) -> None:
    assert int8_fits(**kwargs) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"scale_groups": 4096 // 32}, "only per-channel scales"),  # GGUF Q8_0
        ({"zero_point": True}, "zero point"),
        ({"code_signed": False}, "only signed int8"),
        ({"code_bits": 4}, "only signed int8"),
        ({"device": "cuda"}, "CPU-only"),
        ({"act_dtype": torch.float64}, "activation dtype"),
        ({"scale_dtype": torch.float64}, "scale dtype"),
    ],
)
def test_refusals_say_why(kwargs: dict[str, object], reason: str) -> None:
    fit = int8_fits(n=4096, k=4096, **kwargs)  # type: ignore[arg-type]
    assert not fit.fits and reason in fit.reason
