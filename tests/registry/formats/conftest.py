"""Tiny valid containers the gate tests mutate: written by safetensors and gguf-py, never by hand."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import quantize
from safetensors.numpy import save_file


def write_safetensors(path: Path) -> Path:
    rng = np.random.default_rng(0)
    tensors = {
        "model.embed.weight": rng.standard_normal((4, 6)).astype(np.float16),
        "model.layers.0.q.weight": rng.standard_normal((3, 5)).astype(np.float32),
        "model.layers.0.q.bias": np.arange(5, dtype=np.int64),
        "model.layers.0.mask": np.array([True, False, True]),
        "model.layers.0.codes": np.arange(7, dtype=np.uint8),
        "model.layers.0.idx": np.arange(3, dtype=np.int32),
        "model.empty": np.zeros((0, 3), dtype=np.float64),
    }
    save_file(
        {k: np.ascontiguousarray(v) for k, v in tensors.items()},
        str(path),
        metadata={"format": "np", "producer": "shardport-tests"},
    )
    return path


def write_gguf(
    path: Path, *, alignment: int | None = 64, endian: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE
) -> Path:
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    w.add_name("tiny")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint32("llama.block_count", 1)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_array("llama.small_ints", [1, 2, 3])
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(100)])
    w.add_array("tokenizer.ggml.scores", [float(i) for i in range(100)])
    w.add_string("general.namf", "dup-candidate")
    f32 = rng.standard_normal((4, 64)).astype(np.float32)
    for qtype, name in (
        (gguf.GGMLQuantizationType.Q8_0, "token_embd.weight"),
        (gguf.GGMLQuantizationType.Q4_0, "blk.0.attn_q.weight"),
    ):
        q = quantize(f32, qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
    w.add_tensor("blk.0.attn_k.weight", rng.standard_normal((2, 32)).astype(np.float16))
    w.add_tensor("blk.0.attn_l.weight", rng.standard_normal((2, 32)).astype(np.float16))
    w.add_tensor("output_norm.weight", rng.standard_normal(64).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def st_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_safetensors(tmp_path_factory.mktemp("st") / "model.safetensors")


@pytest.fixture(scope="session")
def st_bytes(st_path: Path) -> bytes:
    return st_path.read_bytes()


@pytest.fixture(scope="session")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "model.gguf")


@pytest.fixture(scope="session")
def gguf_bytes(gguf_path: Path) -> bytes:
    return gguf_path.read_bytes()


@pytest.fixture(scope="session")
def make_gguf() -> object:
    """The GGUF writer above, for tests that need a variant (no alignment key, big-endian)."""
    return write_gguf
