"""The graph on the device it is given: every tensor it makes lies there, a tensor elsewhere is named.

No GPU here: the graph runs with an explicit ``torch.device("cpu")`` inside ``torch.device("meta")``,
which makes the meta device the default of every factory call that names none. A tensor the graph made
without naming the rank's device would land on meta and the run would fail; it runs, and its logits
are bit for bit those of the default run (tp 1 in one process, tp 2 as two threads of one process).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from graph_cases import DENSE
from graph_threads import run_threads, thread_groups

from shardport.deploy.errors import GraphWeightError
from shardport.deploy.graph import (
    FloatModel,
    Generation,
    Mesh,
    RankModel,
    check_cache,
    compare,
    float_linear,
    random_model,
    reference_model,
    shard,
    tp_split,
)
from shardport.deploy.rank_ops import RankOps, rank_weights
from shardport.registry.families.llama import HF_STEMS

CPU = torch.device("cpu")
PROMPT = [1, 5, 900, 33, 7, 1000, 2, 64]
STEPS = 4
MOE = DENSE.model_copy(
    update={"architecture": "MixtralForCausalLM", "experts": 4, "experts_per_token": 2, "intermediate": 96}
)
TIED = DENSE.model_copy(
    update={"architecture": "Qwen2ForCausalLM", "tied_embeddings": True, "qkv_bias": True}
)


def same(a: Generation, b: Generation) -> bool:
    return (
        torch.equal(a.prompt_logits, b.prompt_logits)
        and torch.equal(a.token_logits, b.token_logits)
        and a.tokens == b.tokens
    )


def tp2(model: FloatModel, device: torch.device | None) -> list[Generation]:
    """Both ranks of a tp 2 run (threads), each building its graph on ``device`` (None: the default)."""
    c, split, groups = model.contract, tp_split(model.contract, 2), thread_groups(2)

    def rank(r: int) -> Generation:
        mesh = Mesh(tp=groups[r], stage=groups[r])
        if device is None:
            return RankModel(c, split.layout(r), shard(model, split, r), mesh).generate(PROMPT, STEPS)
        with torch.device("meta"):  # any tensor made without naming the rank's device lands on meta
            weights = shard(model, split, r, device=device)
            return RankModel(c, split.layout(r), weights, mesh, device=device).generate(PROMPT, STEPS)

    return run_threads([lambda r=r: rank(r) for r in range(2)], groups)


@pytest.mark.parametrize("contract", [DENSE, MOE, TIED], ids=["dense", "moe", "tied-bias"])
def test_an_explicit_device_gives_the_default_runs_logits_bit_for_bit(contract: object) -> None:
    model = random_model(contract, seed=3)  # type: ignore[arg-type]
    default = reference_model(model).generate(PROMPT, STEPS)
    with torch.device("meta"):
        placed = reference_model(model, device=CPU)
        explicit = placed.generate(PROMPT, STEPS)
        cache = check_cache(placed, PROMPT, explicit, 1e-4)
    assert placed.device == CPU and explicit.prompt_logits.device == CPU
    assert explicit.prompt_logits.dtype == torch.float32 and same(explicit, default)
    assert cache.ok and cache.steps == STEPS - 1
    runs, defaults = tp2(model, CPU), tp2(model, None)
    for run, base in zip(runs, defaults, strict=True):
        assert same(run, base)  # the same sums in the same order: identical
        assert compare(run, default, 1e-4).ok  # and a real tp 2 run: within float32 reordering


def test_the_meta_default_catches_a_tensor_made_without_a_device() -> None:
    """The check above can fail: an operator that makes its output without naming a device is named."""
    model = random_model(DENSE, seed=4)
    c, split = DENSE, tp_split(DENSE, 1)

    def forgetful(weight: torch.Tensor) -> object:
        inner = float_linear(weight)

        def linear(x: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(x.shape[0], weight.shape[0])  # no device: the default one
            return out + inner(x).to(out.device) if out.device == x.device else out

        return linear

    weights = shard(model, split, 0, linear=forgetful, device=CPU)  # type: ignore[arg-type]
    graph = RankModel(c, split.layout(0), weights, Mesh.local(), device=CPU)
    assert torch.equal(
        graph.forward(PROMPT, graph.new_cache()), reference_model(model).forward(PROMPT, graph.new_cache())
    )
    with torch.device("meta"), pytest.raises(GraphWeightError, match="layer 0 q output: a tensor on meta"):
        graph.forward(PROMPT, graph.new_cache())


def test_tensors_on_another_device_are_refused_naming_them() -> None:
    model = random_model(TIED, seed=5)
    c, split = TIED, tp_split(TIED, 1)
    weights = shard(model, split, 0)
    meta = torch.device("meta")
    layer = weights.layers[1]
    moved = dataclasses.replace(layer, post_norm=layer.post_norm.to(meta))
    with pytest.raises(GraphWeightError, match="layer 1 post-attention norm: a tensor on meta, the rank"):
        RankModel(
            c, split.layout(0), dataclasses.replace(weights, layers=(weights.layers[0], moved)), Mesh.local()
        )
    bias = dataclasses.replace(layer.attention, k_bias=torch.zeros(1, device=meta))
    with pytest.raises(GraphWeightError, match="layer 1 k bias: a tensor on meta"):
        placed = dataclasses.replace(
            weights, layers=(weights.layers[0], dataclasses.replace(layer, attention=bias))
        )
        RankModel(c, split.layout(0), placed, Mesh.local())
    # a graph asked to run on meta with CPU weights refuses them before any step
    with pytest.raises(GraphWeightError, match="final norm: a tensor on cpu, the rank computes on meta"):
        RankModel(c, split.layout(0), weights, Mesh.local(), device=meta)
    # operators whose outputs come back elsewhere: the embedding's rows, an MLP's gate
    elsewhere = dataclasses.replace(
        weights, embed=lambda ids: torch.zeros(ids.shape[0], c.hidden, device=meta)
    )
    graph = RankModel(c, split.layout(0), elsewhere, Mesh.local())
    with pytest.raises(GraphWeightError, match="embedding: a tensor on meta, the rank computes on cpu"):
        graph.forward(PROMPT, graph.new_cache())
    gate = dataclasses.replace(layer.mlp, gate=lambda x: torch.zeros(x.shape[0], c.intermediate, device=meta))
    graph = RankModel(
        c,
        split.layout(0),
        dataclasses.replace(weights, layers=(dataclasses.replace(layer, mlp=gate),)),
        Mesh.local(),
    )
    with pytest.raises(GraphWeightError, match="layer 1 gate output: a tensor on meta"):
        graph.forward(PROMPT, graph.new_cache())


def _checkpoint_floats(model: FloatModel) -> dict[str, torch.Tensor]:
    """A dense model's tensors by Hugging Face name, as a rank's float operators hold them."""
    out = {"model.embed_tokens.weight": model.embed, "model.norm.weight": model.norm}
    if model.head is not None:
        out["lm_head.weight"] = model.head
    for i, f in enumerate(model.layers):
        assert f.mlp is not None
        parts = {
            "q": f.q, "k": f.k, "v": f.v, "o": f.o, "input_norm": f.input_norm, "post_norm": f.post_norm,
            "gate": f.mlp.gate, "up": f.mlp.up, "down": f.mlp.down,
        }  # fmt: skip
        out |= {f"model.layers.{i}.{HF_STEMS[op]}.weight": t for op, t in parts.items()}
        for op, b in (("q", f.q_bias), ("k", f.k_bias), ("v", f.v_bias)):
            if b is not None:
                out[f"model.layers.{i}.{HF_STEMS[op]}.bias"] = b
    return out


def test_a_ranks_float_tensors_are_moved_to_its_device() -> None:
    model = random_model(TIED, seed=6)
    ops = RankOps(floats=_checkpoint_floats(model))
    layers = range(TIED.layers)
    with torch.device("meta"):
        weights = rank_weights(TIED, ops, layers, first=True, last=True, device=CPU)
        graph = RankModel(TIED, tp_split(TIED, 1).layout(0), weights, Mesh.local(), device=CPU)
        run = graph.generate(PROMPT, STEPS)
    assert same(run, reference_model(model).generate(PROMPT, STEPS))
    assert all(t.device == CPU for t in ops.floats.values())
    # on meta: every float tensor of the rank is moved there, none left behind (and the graph accepts them)
    meta = torch.device("meta")
    moved = rank_weights(TIED, ops, layers, first=True, last=True, device=meta)
    assert {t.device for t in ops.floats.values()} == {meta} and ops.float_bytes > 0
    assert moved.norm is ops.floats["model.norm.weight"]
    assert {
        t.device for lay in moved.layers for t in (lay.input_norm, lay.post_norm, lay.attention.q_bias)
    } == {meta}
    RankModel(TIED, tp_split(TIED, 1).layout(0), moved, Mesh.local(), device=meta)


@pytest.mark.slow
def test_the_cuda_bringup_script_runs_its_steps_dry_on_the_cpu(tmp_path: Path) -> None:
    """bench/cuda_bringup.py is for a GPU session; its plumbing (every step, on the CPU) is checked here."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "bench/cuda_bringup.py", "--dry-run", "--results", str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["passed"] and summary["device"] == "cpu"
    assert set(summary["steps"]) == {"kernels", "graph_float32", "graph_int4", "bringup"}
    record = json.loads((tmp_path / "cuda_bringup.dry-run.json").read_text())
    steps = record["steps"]
    assert steps["graph_float32"]["max_abs_diff"] == 0.0  # the same device: the same numbers
    assert steps["graph_int4"]["selected"] == ["cpu.int4pack@1"] and steps["graph_int4"]["greedy_identical"]
    levels = {r["level"] for r in steps["bringup"]["parity"]}
    assert steps["bringup"]["devices"] == {"0": "cpu"} and {"L4", "L5"} <= levels
