"""The graph in one process: the reference, its KV cache, parity records, layouts and weights refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from graph_cases import DENSE

from shardport.deploy.errors import GraphLayoutError, GraphWeightError
from shardport.deploy.graph import (
    Mesh,
    RankLayout,
    RankModel,
    check_cache,
    compare,
    random_model,
    reference_model,
    shard,
    tp_split,
)
from shardport.deploy.graph.model import Generation
from shardport.deploy.graph.reference import FloatModel

PROMPT = [1, 5, 900, 33, 7, 1000, 2]


def test_kv_cache_decode_equals_full_prefill() -> None:
    model = reference_model(random_model(DENSE, seed=0))
    run = model.generate(PROMPT, 5)
    assert len(run.tokens) == 5 and run.token_logits.shape == (5, DENSE.vocab)
    assert torch.equal(run.token_logits[0], run.prompt_logits[-1])
    check = check_cache(model, PROMPT, run, tolerance=1e-4)
    assert check.steps == 4 and check.ok, check
    # the check can fail: a cache that forgot its first position gives other logits
    cache = model.new_cache()
    model.forward(PROMPT, cache)
    for layer in cache.keys:
        cache.keys[layer], cache.values[layer] = cache.keys[layer][1:], cache.values[layer][1:]
    cache.length -= 1
    stale = model.forward([run.tokens[0]], cache)[-1]
    assert float((stale - run.token_logits[1]).abs().max()) > 1e-3
    # one whole-sequence prefill stands for a fresh prefill of each prefix (causal attention)
    for i in range(1, 5):
        prefix = model.forward([*PROMPT, *run.tokens[:i]], model.new_cache())[-1]
        assert float((prefix - run.token_logits[i]).abs().max()) <= check.max_abs_diff + 1e-5
    # and check_cache fails on a decode step whose logits came from elsewhere
    bent = run.token_logits.clone()
    bent[3] = stale
    wrong = check_cache(model, PROMPT, Generation(run.prompt_logits, run.tokens, bent), tolerance=1e-4)
    assert not wrong.ok and wrong.max_abs_diff > 1e-3 and wrong.steps == 4


def test_parity_records_catch_a_perturbed_weight() -> None:
    base = random_model(DENSE, seed=1)
    ref = reference_model(base).generate(PROMPT, 4)
    same = compare(reference_model(base).generate(PROMPT, 4), ref, tolerance=1e-5)
    assert same.ok and same.max_abs_diff == 0.0 and all(same.top1_agree) and same.positions == len(PROMPT)
    layer = dataclasses.replace(base.layers[1], o=base.layers[1].o * 1.5)
    other = FloatModel(base.contract, base.embed, (base.layers[0], layer), base.norm, base.head)
    parity = compare(reference_model(other).generate(PROMPT, 4), ref, tolerance=1e-3)
    assert not parity.ok and parity.max_abs_diff > 1e-3
    assert parity.model_dump()["tolerance"] == 1e-3  # plain data for the evidence


def test_tp_split_follows_the_planner() -> None:
    two = tp_split(DENSE, 2)  # 3 kv groups of 2 heads over 2 ranks: whole groups, uneven
    assert two.q_heads == ((0, 4), (4, 6)) and two.kv_heads == ((0, 2), (2, 3))
    assert two.vocab == ((0, 501), (501, 1001)) and two.intermediate == ((0, 100), (100, 200))
    six = tp_split(DENSE, 6)  # tp > kv heads: one query head each, kv heads replicated
    assert six.q_heads == tuple((h, h + 1) for h in range(6))
    assert six.kv_heads == ((0, 1), (0, 1), (1, 2), (1, 2), (2, 3), (2, 3))
    with pytest.raises(GraphLayoutError, match="two kv heads"):
        tp_split(DENSE, 4)


def test_layouts_and_weights_the_graph_refuses() -> None:
    model = random_model(DENSE, seed=2)
    split = tp_split(DENSE, 2)
    with pytest.raises(GraphLayoutError, match=r"attend with kv heads 0\.\.1"):
        RankLayout(0, ((0, 4), (4, 6)), ((0, 1), (1, 3)), split.vocab).check(DENSE)
    with pytest.raises(GraphLayoutError, match="contiguous"):
        RankLayout(0, split.q_heads, split.kv_heads, ((0, 500), (501, 1001))).check(DENSE)
    with pytest.raises(GraphLayoutError, match="tp rank 1 of 2, the mesh's tp group rank 0 of 1"):
        RankModel(DENSE, split.layout(1), shard(model, split, 1), Mesh.local())
    whole = tp_split(DENSE, 1)
    weights = shard(model, whole, 0)
    with pytest.raises(GraphWeightError, match="first stage needs the embedding"):
        RankModel(DENSE, whole.layout(0), dataclasses.replace(weights, embed=None), Mesh.local())
    # a linear of the wrong width (a rank given another rank's slice) is named
    wrong = shard(model, split, 0)
    bad = RankModel(DENSE, whole.layout(0), dataclasses.replace(weights, layers=wrong.layers), Mesh.local())
    with pytest.raises(GraphWeightError, match=r"layer 0 q: expected output \[7, 144\], found \[7, 96\]"):
        bad.forward(PROMPT, bad.new_cache())
    with pytest.raises(GraphLayoutError, match=r"0\.\.1000"):
        reference_model(model).forward([1001], reference_model(model).new_cache())
