"""NaN and inf in float weights: push and ``verify PATH`` refuse them (exit 5) naming file, tensor and
flat index; ``--allow-nonfinite`` records a note instead; a quantized weight's float planes never pass.

The element scan itself (:mod:`shardport.registry.formats.finite`) is checked per float format, across
chunk boundaries, against numpy's own ``isfinite``.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from bringup_artifacts import gguf_tiny, gptq_tiny
from safetensors.numpy import load_file, save_file
from support import Cli

from shardport.registry.formats import parse_gguf
from shardport.registry.formats.finite import float_dtype, scan

NORM = "model.layers.1.post_attention_layernorm.weight"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> Cli:
    c = Cli(capsys, str(tmp_path / "store"))
    c.ok("keygen")
    return c


def poke_safetensors(folder: Path, tensor: str, values: dict[int, float]) -> Path:
    """Rewrite ``folder/model.safetensors`` with ``values`` (flat index -> value) set in ``tensor``."""
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    flat = tensors[tensor].reshape(-1)
    for index, value in values.items():
        flat[index] = value
    save_file(tensors, str(path))
    return folder


def poke_gguf(folder: Path, tensor: str, index: int, value: float) -> Path:
    """Write one float32 ``value`` at flat ``index`` of GGUF F32 ``tensor``, in place."""
    path = folder / "model.gguf"
    record = next(t for t in parse_gguf(path).tensors if t.name == tensor)
    assert record.ggml_type == "F32"
    with path.open("r+b") as f:
        f.seek(record.start + 4 * index)
        f.write(np.float32(value).tobytes())
    return folder


def test_push_refuses_a_nan_in_a_safetensors_norm_naming_file_tensor_and_index(
    cli: Cli, tmp_path: Path
) -> None:
    folder = poke_safetensors(gptq_tiny(tmp_path / "ck"), NORM, {37: np.nan})
    code, doc = cli("push", folder, "llama/nan:v1")
    assert code == 5, doc
    error = doc["error"]
    assert error["type"] == "NonFiniteValueError"
    message = error["message"]
    assert "model.safetensors" in message and f"tensor {NORM!r}" in message
    assert "NaN at flat index 37 (1 NaN, 0 inf of 192 elements)" in message
    assert "--allow-nonfinite" in message  # the remedy names the switch
    assert cli("ls")[1] == []  # nothing was stored


def test_push_refuses_inf_in_the_final_norm(cli: Cli, tmp_path: Path) -> None:
    folder = poke_safetensors(gptq_tiny(tmp_path / "ck"), "model.norm.weight", {5: -np.inf, 190: np.inf})
    code, doc = cli("push", folder, "llama/inf:v1")
    assert code == 5, doc
    assert "tensor 'model.norm.weight'" in doc["error"]["message"]
    assert "-inf at flat index 5 (0 NaN, 2 inf of 192 elements)" in doc["error"]["message"]


def test_push_refuses_a_nan_in_a_gguf_f32_tensor(cli: Cli, tmp_path: Path) -> None:
    folder = poke_gguf(gguf_tiny(tmp_path / "g"), "blk.0.ffn_norm.weight", 100, np.nan)
    code, doc = cli("push", folder, "llama/gnan:v1")
    assert code == 5, doc
    message = doc["error"]["message"]
    assert doc["error"]["type"] == "NonFiniteValueError"
    assert "model.gguf" in message and "tensor 'blk.0.ffn_norm.weight'" in message
    assert "NaN at flat index 100" in message


def test_push_refuses_inf_in_a_gguf_f32_tensor(cli: Cli, tmp_path: Path) -> None:
    folder = poke_gguf(gguf_tiny(tmp_path / "g"), "output_norm.weight", 191, np.inf)
    code, doc = cli("push", folder, "llama/ginf:v1")
    assert code == 5, doc
    assert "+inf at flat index 191 (0 NaN, 1 inf of 192 elements)" in doc["error"]["message"]


def test_allow_nonfinite_pushes_and_records_a_note(cli: Cli, tmp_path: Path) -> None:
    folder = poke_safetensors(gptq_tiny(tmp_path / "ck"), NORM, {37: np.nan})
    pushed = cli.ok("push", folder, "llama/nan:v1", "--allow-nonfinite")
    assert any(f"tensor {NORM!r}" in n and "NaN at flat index 37" in n for n in pushed["notes"]), pushed
    notes = cli.ok("inspect", "llama/nan:v1")["manifest"]["notes"]
    [note] = [n for n in notes if n["code"] == "NonFiniteValueError"]
    assert note["file"] == "model.safetensors" and note["tensor"] == NORM  # relative: the same anywhere
    assert note["found"].startswith("NaN at flat index 37")
    # --strict refuses what push only notes; the switch the user gave still wins for this finding
    again = cli.ok("push", folder, "llama/nan:strict", "--strict", "--allow-nonfinite")
    assert again["digest"] == pushed["digest"]


def test_gguf_allow_nonfinite_records_a_note(cli: Cli, tmp_path: Path) -> None:
    folder = poke_gguf(gguf_tiny(tmp_path / "g"), "blk.1.attn_norm.weight", 3, np.nan)
    pushed = cli.ok("push", folder, "llama/gnan:v1", "--allow-nonfinite")
    assert any("blk.1.attn_norm.weight" in n and "flat index 3" in n for n in pushed["notes"]), pushed


def test_a_quantized_weights_nan_scale_is_refused_even_with_the_switch(cli: Cli, tmp_path: Path) -> None:
    scales = "model.layers.0.self_attn.q_proj.scales"
    folder = poke_safetensors(gptq_tiny(tmp_path / "ck"), scales, {4: np.nan})
    code, doc = cli("push", folder, "llama/scale:v1", "--allow-nonfinite")
    assert code == 5, doc
    assert doc["error"]["type"] == "ScaleValueError"
    message = doc["error"]["message"]
    assert "q_proj" in message and "1 NaN/inf, the first at flat index 4" in message


def test_verify_strict_of_a_checkpoint_folder_fails_on_nan(cli: Cli, tmp_path: Path) -> None:
    folder = poke_safetensors(gptq_tiny(tmp_path / "ck"), NORM, {0: np.nan})
    for flags in (["--strict"], []):
        code, doc = cli("verify", folder, *flags)
        assert code == 5, doc
        [finding] = doc["findings"]
        assert finding["kind"] == "NonFiniteValueError"
        assert NORM in finding["message"] and "NaN at flat index 0" in finding["message"]
    code, doc = cli("verify", folder, "--strict", "--allow-nonfinite")
    assert code == 0, doc
    assert any("NaN at flat index 0" in n for n in doc["notes"])
    code, doc = cli("verify", folder / "model.safetensors", "--strict")  # one file, as a PATH
    assert code == 5 and doc["findings"][0]["kind"] == "NonFiniteValueError"


# The element scan: every float format, the first element's kind and index, the counts, chunking.

CASES = {
    "F32": (np.float32, None),
    "F64": (np.float64, None),
    "F16": (np.float16, None),
    "BF16": (np.float32, lambda a: (a.view(np.uint32) >> 16).astype(np.uint16)),
}


@pytest.mark.parametrize("dtype", sorted(CASES))
@pytest.mark.parametrize("chunk", [8, 64, 1 << 20])
def test_scan_finds_the_first_non_finite_element_and_counts_the_rest(dtype: str, chunk: int) -> None:
    rng = np.random.default_rng(1)
    kind, encode = CASES[dtype]
    values = rng.standard_normal(1000).astype(kind)
    values[[333, 334, 999]] = [np.nan, -np.inf, np.inf]
    raw = encode(values) if encode else values
    data = b"\x00" * 24 + raw.tobytes() + b"\xff" * 16  # the tensor sits inside a file
    found = scan(io.BytesIO(data), 24, 24 + raw.nbytes, dtype, chunk_bytes=chunk)
    assert found is not None
    assert (found.index, found.kind, found.nan, found.inf, found.elements) == (333, "NaN", 1, 2, 1000)
    clean = np.where(np.isfinite(values), values, 0).astype(kind)
    raw = encode(clean) if encode else clean
    assert scan(io.BytesIO(raw.tobytes()), 0, raw.nbytes, dtype, chunk_bytes=chunk) is None


def test_scan_reads_the_eight_bit_float_patterns() -> None:
    # e4m3fn: S.1111.111 is NaN, the only non-finite; 0x7E (448) is finite
    e4m3 = bytes([0x00, 0x7E, 0xFE, 0xFF, 0x7F])
    found = scan(io.BytesIO(e4m3), 0, 5, "F8_E4M3")
    assert found is not None and (found.index, found.kind, found.nan, found.inf) == (3, "NaN", 2, 0)
    # e5m2: exponent 11111 is inf (mantissa 0) or NaN; 0x7B is the largest finite
    e5m2 = bytes([0x7B, 0xFC, 0x7C, 0x7D])
    found = scan(io.BytesIO(e5m2), 0, 4, "F8_E5M2")
    assert found is not None and (found.index, found.kind, found.nan, found.inf) == (1, "-inf", 1, 2)
    assert scan(io.BytesIO(bytes([0x00, 0xFE])), 0, 2, "F8_E8M0") is None  # 0xFF alone is NaN
    assert float_dtype("F32") and float_dtype("BF16") and float_dtype("F8_E8M0")
    assert not float_dtype("Q4_0") and not float_dtype("I32") and not float_dtype("U8")


def test_a_nan_gguf_q8_0_block_scale_is_refused_naming_its_block(cli: Cli, tmp_path: Path) -> None:
    folder = gguf_tiny(tmp_path / "g")
    path = folder / "model.gguf"
    record = next(t for t in parse_gguf(path).tensors if t.name == "blk.0.attn_v.weight")
    assert record.ggml_type == "Q8_0"  # blocks of 34 bytes: f16 d, then 32 int8 codes
    block = 13  # hidden 192 = 6 blocks a row: row 2, the second block
    with path.open("r+b") as f:
        f.seek(record.start + 34 * block)
        f.write(np.float16(np.nan).tobytes())
    code, doc = cli("push", folder, "llama/q8nan:v1", "--allow-nonfinite")  # the switch: float tensors only
    assert code == 5, doc
    assert doc["error"]["type"] == "ScaleValueError"
    assert "1 NaN/inf, the first in block 13 (row 2, flat elements 416..447)" in doc["error"]["message"]


def test_decode_of_a_local_checkpoint_shows_the_nan(cli: Cli, tmp_path: Path) -> None:
    folder = poke_safetensors(gptq_tiny(tmp_path / "ck"), NORM, {2: np.nan})
    out = tmp_path / "norm.safetensors"
    cli.ok("decode", folder, NORM, "--out", out)  # inspection, not a gate: the value is what is shown
    values = next(iter(load_file(str(out)).values()))
    assert np.isnan(values.reshape(-1)[2]) and np.isfinite(np.delete(values.reshape(-1), 2)).all()
