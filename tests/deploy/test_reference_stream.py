"""The driver's streamed, teacher-forced float32 reference against the whole-model reference it replaces.

Real checkpoints pushed to a local store (GPTQ, the GGUF mix with a tied Q8_0 embedding, a GPTQ
Mixtral, a Qwen2 with q/k/v bias), loaded through the loader stage by stage: the same logits as the
whole model decoded at once, the same greedy tokens, and at most one layer's float weights alive.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from bringup_artifacts import HIDDEN, LAYERS, gguf_tiny, gptq_mixtral, gptq_tiny
from graph_cases import DENSE
from llama_artifacts import ok
from safetensors.numpy import load_file, save_file

from shardport.deploy.contract import check_inventory, contract_of
from shardport.deploy.errors import GraphWeightError
from shardport.deploy.graph import compare, random_model, reference_model, shard, tp_split
from shardport.deploy.graph.checkpoint import float_model
from shardport.deploy.graph.model import Generation
from shardport.deploy.graph.staged import row_lookup, teacher_forced
from shardport.deploy.reference_stream import FloatLedger, streamed_reference
from shardport.loader import load_rank
from shardport.placement import Topology
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.contracts.decode import decode_weight
from shardport.registry.session import Session
from shardport.registry.trust.resolve import Resolved, resolve

PROMPT = (1, 5, 300, 7, 396)
STEPS = 4


def _qwen2_with_bias(folder: Path) -> Path:
    """``gptq_tiny`` as a Qwen2: float16 q/k/v biases (and its architecture)."""
    gptq_tiny(folder)
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    rng = np.random.default_rng(11)
    for layer in range(LAYERS):
        for op, width in (("q", HIDDEN), ("k", HIDDEN // 2), ("v", HIDDEN // 2)):
            bias = (rng.standard_normal(width) * 0.5).astype(np.float16)
            tensors[f"model.layers.{layer}.self_attn.{op}_proj.bias"] = bias
    save_file(tensors, str(path))
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["Qwen2ForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


BUILDERS = {"gptq": gptq_tiny, "gguf-mix": gguf_tiny, "mixtral": gptq_mixtral, "qwen2-bias": _qwen2_with_bias}


def _pushed(home: Path, tmp: Path, kind: str) -> tuple[Session, Resolved, Any]:
    store = str(tmp / "store")
    ok(store, "keygen")
    ok(store, "push", BUILDERS[kind](tmp / kind), f"m/{kind}:v1")
    session = Session.open(store)
    resolved = resolve(session, parse_ref(f"m/{kind}:v1"))
    contract = contract_of(resolved.manifest)
    check_inventory(contract, resolved.manifest)
    return session, resolved, contract


def _whole_reference(session: Session, resolved: Resolved, contract: Any) -> tuple[Generation, int]:
    """The reference as the driver built it before streaming: the whole checkpoint decoded at once.

    Returns its greedy generation and the float bytes it held.
    """
    whole = load_rank(session, resolved, Topology(tp=1), 0)
    planes: dict[str, dict[str, Any]] = {}
    for t in whole.tensors:
        if t.weight is not None:
            planes.setdefault(t.weight, {})[t.tensor] = t.array
    weights = {w.name: w for w in resolved.manifest.weights or []}
    tensors = {
        name: torch.from_numpy(np.ascontiguousarray(decode_weight(weights[name], p)))
        for name, p in planes.items()
    }
    held = sum(t.numel() * 4 for t in tensors.values())
    return reference_model(float_model(contract, tensors)).generate(list(PROMPT), STEPS), held


def _float_bytes(resolved: Resolved, prefix: str) -> int:
    return sum(
        4 * int(np.prod(w.shape.extents))
        for w in resolved.manifest.weights or []
        if w.name.startswith(prefix)
    )


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_streamed_reference_equals_the_whole_model_reference(home: Path, tmp_path: Path, kind: str) -> None:
    session, resolved, contract = _pushed(home, tmp_path, kind)
    assert contract.moe == (kind == "mixtral") and contract.qkv_bias == (kind == "qwen2-bias")
    assert contract.tied_embeddings == (kind == "gguf-mix")
    whole, whole_bytes = _whole_reference(session, resolved, contract)
    ledger = FloatLedger()  # every matrix decoded in chunks of rows (64 KiB: 85 rows of 192, 21 of 768)
    streamed = streamed_reference(
        session, resolved, contract, PROMPT, whole.tokens, ledger, chunk_bytes=2**16
    )
    # the same prefill and cached decode steps on the same tokens: the same floating-point results
    assert torch.equal(streamed.prompt_logits, whole.prompt_logits)
    assert float((streamed.token_logits - whole.token_logits).abs().max()) <= 1e-5
    assert streamed.tokens == whole.tokens
    parity = compare(whole, streamed, tolerance=0.0)
    assert parity.ok and parity.max_abs_diff == parity.decode_max_abs_diff == 0.0
    # memory: one layer's float weights (or the head) at a time, all freed at the end
    stem = "blk." if contract.source == "gguf" else "model.layers."
    layer = max(_float_bytes(resolved, f"{stem}{i}.") for i in range(contract.layers))
    head = 4 * contract.vocab * contract.hidden
    assert ledger.live == 0
    assert ledger.decoded >= whole_bytes - head  # every weight decoded once (the embedding: its rows)
    assert ledger.peak <= max(layer, head) + 4 * contract.hidden  # + the final norm with the head
    assert ledger.peak <= 0.6 * whole_bytes


def test_divergent_run_is_caught_at_its_first_wrong_token(home: Path, tmp_path: Path) -> None:
    session, resolved, contract = _pushed(home, tmp_path, "gguf-mix")
    whole, _ = _whole_reference(session, resolved, contract)
    wrong = (*whole.tokens[:2], (whole.tokens[2] + 1) % contract.vocab, whole.tokens[3])
    streamed = streamed_reference(session, resolved, contract, PROMPT, wrong)
    assert streamed.tokens[:3] == whole.tokens[:3]  # the reference's argmax, not the run's token
    assert torch.equal(streamed.token_logits[:3], whole.token_logits[:3])
    run = Generation(whole.prompt_logits, wrong, whole.token_logits)
    parity = compare(run, streamed, tolerance=1e-3)
    assert not parity.ok and parity.reference_tokens[2] != parity.tokens[2]


def test_teacher_forced_stages_match_generate_for_every_stage_split() -> None:
    moe = {"architecture": "MixtralForCausalLM", "experts": 4, "experts_per_token": 2, "intermediate": 96}
    tied = {"architecture": "Qwen2ForCausalLM", "tied_embeddings": True, "qkv_bias": True}
    for c in (DENSE, DENSE.model_copy(update=moe), DENSE.model_copy(update=tied)):
        model = random_model(c, seed=2)
        want = reference_model(model).generate(list(PROMPT[:3]), 3)
        split = tp_split(c, 1)
        pieces = [
            shard(model, split, 0, layers=range(0), last=False),
            *(
                shard(model, split, 0, layers=range(i, i + 1), first=False, last=False)
                for i in range(c.layers)
            ),
            shard(model, split, 0, layers=range(0), first=False),
        ]
        got = teacher_forced(c, iter(pieces), PROMPT[:3], want.tokens)
        assert torch.equal(got.prompt_logits, want.prompt_logits) and got.tokens == want.tokens
        assert torch.equal(got.token_logits, want.token_logits)
        with pytest.raises(GraphWeightError, match="no stage held the final norm"):
            teacher_forced(c, iter(pieces[:-1]), PROMPT[:3], want.tokens)
        with pytest.raises(GraphWeightError, match="a stage after the one with the output head"):
            teacher_forced(c, iter([*pieces, pieces[1]]), PROMPT[:3], want.tokens)


def test_row_lookup_holds_only_its_rows() -> None:
    table = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    lookup = row_lookup([1, 4, 5], table[[1, 4, 5]])
    assert torch.equal(lookup(torch.tensor([5, 1, 1, 4])), table[[5, 1, 1, 4]])
    with pytest.raises(GraphWeightError, match=r"ids \[0, 3\] are not among the held rows"):
        lookup(torch.tensor([0, 4, 3]))
    with pytest.raises(GraphWeightError, match="sorted distinct ids"):
        row_lookup([4, 1], table[[4, 1]])


def test_a_loaded_stage_is_freed_as_soon_as_it_is_dropped(home: Path, tmp_path: Path) -> None:
    """No reference cycle keeps a stage's tensors (the tile index parse once kept every caller's frame)."""
    import gc
    import weakref

    from shardport.deploy.reference_stream import _stage_planes

    session, resolved, contract = _pushed(home, tmp_path, "gptq")
    gc.collect()
    gc.disable()
    try:
        planes = _stage_planes(session, resolved, contract.layers, 1)
        arrays = [weakref.ref(a) for p in planes.values() for a in p.values()]
        assert len(arrays) > 10 and all(a() is not None for a in arrays)
        del planes
        assert [a for a in arrays if a() is not None] == []
    finally:
        gc.enable()
