"""The graph across real gloo processes on 127.0.0.1 against the single-process float32 reference.

Tolerance: float32 logits of unit scale; tensor-parallel partial sums add in another order than one
process does, which moves logits by ~1e-6 here; 1e-4 leaves room and still catches any wrong slice
(a misplaced head or vocabulary row moves logits by ~1e-1, see test_graph's perturbed weight).
"""

from __future__ import annotations

import pytest
import torch
from graph_cases import DENSE

from shardport.deploy.graph import (
    FloatModel,
    KVCache,
    Linear,
    Mesh,
    RankModel,
    compare,
    float_linear,
    random_model,
    reference_model,
    shard,
    tp_split,
)
from shardport.deploy.local_ranks import Job, run_local

TOLERANCE = 1e-4
PROMPT = (1, 5, 900, 33, 7, 1000, 2, 64)
STEPS = 5
MOE = DENSE.model_copy(
    update={"architecture": "MixtralForCausalLM", "experts": 4, "experts_per_token": 2, "intermediate": 96}
)
TIED = DENSE.model_copy(
    update={"architecture": "Qwen2ForCausalLM", "tied_embeddings": True, "qkv_bias": True}
)


def check(results: list[dict[str, object]], job: Job) -> None:
    reference = reference_model(job.model).generate(job.prompt, job.steps)
    assert len(set(reference.tokens)) > 1  # a decode that repeats one token would prove little
    for result in results:  # every rank holds the last stage's logits and the same tokens
        run = result["generation"]
        parity = compare(run, reference, TOLERANCE)  # type: ignore[arg-type]
        assert parity.ok, (job.tp, job.ep, job.pp, result["rank"], parity)
        assert parity.max_abs_diff > 0 or job.tp == 1  # a tp run really summed in another order
        assert result["cache"]["max_abs_diff"] <= TOLERANCE, result["cache"]  # type: ignore[index]
        assert result["cache"]["steps"] == STEPS - 1  # type: ignore[index]


def routing(model: FloatModel) -> torch.Tensor:
    """The experts the reference picks for the prompt, read at its routers' outputs."""
    seen: list[torch.Tensor] = []

    def recording(weight: torch.Tensor) -> Linear:
        inner = float_linear(weight)

        def linear(x: torch.Tensor) -> torch.Tensor:
            y = inner(x)
            if weight.shape[0] == model.contract.experts:
                seen.append(y)
            return y

        return linear

    c = model.contract
    weights = shard(model, tp_split(c, 1), 0, linear=recording)
    RankModel(c, tp_split(c, 1).layout(0), weights, Mesh.local()).forward(PROMPT, KVCache())
    return torch.cat([torch.topk(y, c.experts_per_token).indices for y in seen])


@pytest.mark.slow
def test_world_of_two_tp2_ep2_pp2() -> None:
    jobs = [
        Job(
            random_model(DENSE, seed=10), tp=2, prompt=PROMPT, steps=STEPS
        ),  # uneven heads 4 + 2, vocab 501 + 500
        Job(random_model(MOE, seed=11), tp=1, ep=2, prompt=PROMPT, steps=STEPS),  # experts 0-1 | 2-3
        Job(random_model(DENSE, seed=12), tp=1, pp=2, prompt=PROMPT, steps=STEPS),  # layer 0 | layer 1
    ]
    for job, results in zip(jobs, run_local(jobs), strict=True):
        assert len(results) == 2
        check(results, job)
    # the MoE job routed tokens to experts of both ep ranks (else ep=2 proved nothing)
    routed = routing(jobs[1].model)
    assert bool((routed < 2).any()) and bool((routed >= 2).any())


@pytest.mark.slow
def test_world_of_three_tp3_tied_with_bias_and_moe() -> None:
    jobs = [
        Job(random_model(TIED, seed=13), tp=3, prompt=PROMPT, steps=STEPS),  # 2 heads, 1 kv head each
        Job(random_model(MOE, seed=14), tp=3, prompt=PROMPT, steps=STEPS),  # every expert split 32/32/32
    ]
    for job, results in zip(jobs, run_local(jobs), strict=True):
        assert len(results) == 3
        check(results, job)
