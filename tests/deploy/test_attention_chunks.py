"""Attention takes its queries in chunks: the scores one chunk makes are bounded (``model.SCORE_BYTES``),
not ``heads x T x T`` for a prompt of T tokens, and chunking changes no result."""

from __future__ import annotations

import pytest
import torch
from graph_cases import DENSE

from shardport.deploy.graph import model as graph_model
from shardport.deploy.graph import random_model, reference_model
from shardport.deploy.graph.model import SCORE_BYTES, query_chunk


def test_a_chunk_of_scores_stays_within_the_bound() -> None:
    for heads, keys in [(1, 1), (8, 4096), (32, 32768), (64, 131072), (128, 10**6)]:
        step = query_chunk(heads, keys)
        assert step >= 1 and (step == 1 or 4 * heads * keys * step <= SCORE_BYTES)
    assert query_chunk(32, 4000) == 131  # a 4,000-token prompt: 31 chunks of <= 64 MiB, not 2 GB at once
    assert query_chunk(8, 16) == SCORE_BYTES // (4 * 8 * 16)  # a short prompt: one chunk, as before


def test_chunked_attention_gives_the_unchunked_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    model = reference_model(random_model(DENSE, seed=3))
    prompt = [(7 * i + 1) % DENSE.vocab for i in range(37)]
    whole = model.forward(prompt, model.new_cache())
    monkeypatch.setattr(graph_model, "SCORE_BYTES", 4 * DENSE.heads * 40 * 5)  # 5 queries per chunk here
    assert query_chunk(DENSE.heads, 37) == 5
    chunked = model.forward(prompt, model.new_cache())
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-5)
    cache = model.new_cache()  # and a decode step after a chunked prefill
    model.forward(prompt[:-1], cache)
    torch.testing.assert_close(model.forward(prompt[-1:], cache)[-1], whole[-1], rtol=0, atol=1e-4)
