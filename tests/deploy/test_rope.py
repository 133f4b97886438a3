"""Rotary embeddings and llama.cpp's Q/K row permutation (GGUF llama files)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from graph_cases import contract

from shardport.deploy.graph import (
    gguf_qk_rows,
    permute_qk_for_gguf,
    random_model,
    reference_model,
    unpermute_gguf_qk,
)
from shardport.deploy.graph.reference import FloatModel
from shardport.deploy.graph.rope import apply_rotary, inverse_frequencies, rotary_tables
from shardport.registry.contracts.graph import RopeScaling


def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py's LlamaModel.permute, as llama.cpp writes it (the convention under test)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize(("heads", "head_dim"), [(6, 24), (3, 24), (9, 64), (1, 2)])
def test_permutation_is_llama_cpps_and_round_trips(heads: int, head_dim: int) -> None:
    w = torch.randn(heads * head_dim, 40)
    gguf = permute_qk_for_gguf(w, heads)
    assert torch.equal(gguf, llama_cpp_permute(w, heads))
    assert torch.equal(unpermute_gguf_qk(gguf, heads), w)
    assert torch.equal(w[gguf_qk_rows(heads, head_dim)], gguf)
    # a 1-D bias permutes the same way
    b = torch.randn(heads * head_dim)
    assert torch.equal(unpermute_gguf_qk(llama_cpp_permute(b, heads), heads), b)
    # the permutation stays inside each head: a head-aligned slice of the GGUF rows is the permuted slice
    for h in range(heads):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        assert torch.equal(gguf[rows], permute_qk_for_gguf(w[rows], 1))


def test_interleaved_rope_on_gguf_rows_is_half_rope_on_hf_rows() -> None:
    c = contract()
    cos, sin = rotary_tables(c, torch.arange(5, 12))
    wq = torch.randn(c.heads * c.head_dim, c.hidden)
    x = torch.randn(7, c.hidden)
    hf = apply_rotary((x @ wq.T).view(7, c.heads, c.head_dim), cos, sin, "half")
    gg = apply_rotary(
        (x @ permute_qk_for_gguf(wq, c.heads).T).view(7, c.heads, c.head_dim), cos, sin, "interleaved"
    )
    assert torch.allclose(unpermute_gguf_qk(gg.reshape(7, -1).T, c.heads).T, hf.reshape(7, -1), atol=1e-5)
    assert not torch.allclose(gg.reshape(7, -1), hf.reshape(7, -1), atol=1e-2)  # the orders do differ


def test_gguf_ordered_model_gives_the_hugging_face_logits() -> None:
    hf = random_model(contract(), seed=3)
    layers = tuple(
        dataclasses.replace(
            layer,
            q=permute_qk_for_gguf(layer.q, hf.contract.heads),
            k=permute_qk_for_gguf(layer.k, hf.contract.kv_heads),
        )
        for layer in hf.layers
    )
    gguf = FloatModel(
        hf.contract.model_copy(update={"rope_pairs": "interleaved"}), hf.embed, layers, hf.norm, hf.head
    )
    prompt = [3, 1000, 17, 256, 9]
    a, b = reference_model(hf).generate(prompt, 3), reference_model(gguf).generate(prompt, 3)
    assert torch.allclose(a.prompt_logits, b.prompt_logits, atol=1e-4)
    assert a.tokens == b.tokens
    # running the GGUF rows with the wrong pairing is a different model
    wrong = FloatModel(hf.contract, hf.embed, layers, hf.norm, hf.head)
    assert not torch.allclose(
        reference_model(wrong).forward(prompt, reference_model(wrong).new_cache()), a.prompt_logits, atol=1e-2
    )


def test_rope_scaling_frequencies() -> None:
    inv = inverse_frequencies(128, 500000.0, None)
    assert inv[0] == 1.0 and torch.isclose(
        inv[-1], torch.tensor(500000.0 ** (-126 / 128), dtype=torch.float64)
    )
    assert torch.allclose(inverse_frequencies(128, 500000.0, RopeScaling(kind="linear", factor=4.0)), inv / 4)
    llama3 = RopeScaling(
        kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192
    )
    scaled = inverse_frequencies(128, 500000.0, llama3)
    wavelen = 2 * torch.pi / inv
    assert torch.equal(scaled[wavelen < 8192 / 4], inv[wavelen < 8192 / 4])  # high frequencies kept
    assert torch.allclose(scaled[wavelen > 8192], inv[wavelen > 8192] / 8)  # low frequencies divided
    medium = (wavelen >= 8192 / 4) & (wavelen <= 8192)
    assert medium.any() and bool(((scaled[medium] < inv[medium]) & (scaled[medium] > inv[medium] / 8)).all())
